"""The pure-core rule of DESIGN.md, checked mechanically.

``topology/`` and ``scheduler/core/`` are pure functions of their arguments: no network,
files, environment, clock or unseeded randomness, no kubernetes/fastapi/pydantic imports.
Two checks: importing every core module in a fresh interpreter loads none of the I/O
frameworks, and an AST scan finds no forbidden import or call.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PURE_DIRS = [REPO / "topology", REPO / "scheduler" / "core"]
BANNED_MODULES = {
    "kubernetes",
    "fastapi",
    "starlette",
    "pydantic",
    "uvicorn",
    "httpx",
    "requests",
    "urllib3",
    "socket",
    "subprocess",
    "os",
    "pathlib",
    "shutil",
    "tempfile",
    "prometheus_client",
}
BANNED_CALLS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("date", "today"),
    ("random", "random"),
    ("random", "randint"),
    ("random", "choice"),
    ("random", "shuffle"),
    ("random", "sample"),
    ("random", "uniform"),
    ("random", "seed"),
    ("np.random", "rand"),
    ("np.random", "randint"),
    ("np.random", "choice"),
    ("np.random", "shuffle"),
    ("np.random", "seed"),
    ("np.random", "random"),
}


def _pure_files() -> list[Path]:
    return sorted(p for d in PURE_DIRS for p in d.rglob("*.py"))


def _modules() -> list[str]:
    return [
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in _pure_files()
    ]


def test_core_imports_load_no_io_framework() -> None:
    code = (
        "import importlib, sys, json\n"
        f"for m in {_modules()!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    import json

    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    bad = loaded & {
        "kubernetes",
        "fastapi",
        "starlette",
        "pydantic",
        "uvicorn",
        "httpx",
        "requests",
        "prometheus_client",
    }
    assert not bad, f"pure core pulls in I/O frameworks: {sorted(bad)}"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_forbidden_imports_or_calls(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in BANNED_MODULES:
                    problems.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in BANNED_MODULES:
                problems.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in ("open", "input", "print", "eval", "exec"):
                problems.append(f"line {node.lineno}: call to {name}()")
            head, _, attr = name.rpartition(".")
            if (head, attr) in BANNED_CALLS or (
                head.endswith("numpy.random") and attr != "default_rng"
            ):
                problems.append(f"line {node.lineno}: call to {name}()")
    assert not problems, f"{path.relative_to(REPO)} breaks the pure-core rule:\n" + "\n".join(
        problems
    )


BLAS_CALLS = {"dot", "vdot", "inner", "matmul", "tensordot", "einsum"}
"""numpy calls that may hand a float reduction to BLAS (``einsum`` can, when optimizing)."""
DETERMINISTIC_DIRS = [*PURE_DIRS, REPO / "benchmarks" / "engine", REPO / "benchmarks" / "sim"]


@pytest.mark.parametrize(
    "path",
    sorted(p for d in DETERMINISTIC_DIRS for p in d.rglob("*.py")),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_blas_reductions(path: Path) -> None:
    """No ``@`` or BLAS call in the core and the replay engine: OpenBLAS chooses its kernel
    per processor, and the last bits of its sums follow (DEVELOPING.md, Conventions;
    ``scheduler.core.sharing.weighted_sum`` sums the same on every CPU)."""
    tree = ast.parse(path.read_text(), str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.MatMult):
            problems.append(f"line {node.lineno}: the @ operator")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            head, _, attr = name.rpartition(".")
            if attr in BLAS_CALLS and (head in ("np", "numpy") or attr == "dot"):
                problems.append(f"line {node.lineno}: call to {name}()")
    assert not problems, f"{path.relative_to(REPO)} sums through BLAS:\n" + "\n".join(problems)

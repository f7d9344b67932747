"""``topoplace topo``: inspect GPU shapes and try GPU-set selection from the command line.

Sub-commands::

    topo show SHAPE_OR_FILE [--json]
    topo select --topology SHAPE_OR_FILE [--available 0,2,4,5] --size 2 [--required 4]
                [--policy nvidia-best-effort|topoplace] [--json]

SHAPE_OR_FILE is a catalog name (``dgx1-v100``...) or a path to ``nvidia-smi topo -m`` text or
a JSON/YAML link list. This module is an I/O edge: it reads the file and hands the text to the
pure :mod:`topology` package.

Exit codes: 0 success, 1 selection refused, 2 usage or input error.

``scheduler/cli/main.py`` calls :func:`add_parser` and dispatches to ``args.func(args)``;
``python -m scheduler.cli.topo ...`` runs :func:`main` for standalone use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topology.links import PCIE_GEN_BY_GENERATION, allocator_pair_weight
from topology.select import POLICIES, best_bottlenecks, select_gpus
from topology.shape import CATALOG, GpuShape, parse_topology_spec

__all__ = ["add_parser", "cmd_select", "cmd_show", "load_shape", "main"]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A user input problem; reported on stderr with exit code 2."""


def load_shape(spec: str) -> GpuShape:
    """Resolve SHAPE_OR_FILE: a catalog name, else a file holding topo -m text or a link list.

    Raises:
        CliError: Neither a catalog name nor a readable, parseable file.
    """
    if spec in CATALOG:
        return CATALOG[spec]
    path = Path(spec)
    if not path.is_file():
        raise CliError(
            f"{spec!r} is neither a catalog shape ({', '.join(sorted(CATALOG))}) nor a file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {spec}: {exc}") from None
    try:
        return parse_topology_spec(text)
    except (ValueError, KeyError) as exc:
        raise CliError(f"cannot parse {spec}: {exc}") from None


def _parse_indices(text: str, shape: GpuShape, what: str) -> int:
    mask = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            index = int(part)
        except ValueError:
            raise CliError(f"--{what}: {part!r} is not a GPU index") from None
        if not 0 <= index < shape.num_gpus:
            raise CliError(f"--{what}: GPU {index} out of range 0..{shape.num_gpus - 1}")
        mask |= 1 << index
    return mask


def _matrix(title: str, shape: GpuShape, cell: Any) -> list[str]:
    n = shape.num_gpus
    cells = [[cell(i, j) for j in range(n)] for i in range(n)]
    width = max([len(f"GPU{n - 1}")] + [len(c) for row in cells for c in row])
    lines = [title, " " * (width + 1) + " ".join(f"{f'GPU{j}':>{width}}" for j in range(n))]
    for i, row in enumerate(cells):
        lines.append(f"{f'GPU{i}':<{width}} " + " ".join(f"{c:>{width}}" for c in row))
    return lines


def _gbps(value: float) -> str:
    return f"{value:g}"


def _shape_json(shape: GpuShape) -> dict[str, Any]:
    return {
        "name": shape.name,
        "num_gpus": shape.num_gpus,
        "generation": shape.generation,
        "assumed": shape.assumed,
        "source": shape.source,
        "numa": list(shape.numa),
        "links": [list(r) for r in shape.links],
        "nvlinks": [list(r) for r in shape.nvlinks],
        "pcie": [list(r) for r in shape.pcie],
        "bandwidth_gbps": [list(r) for r in shape.bandwidth],
    }


def cmd_show(args: argparse.Namespace) -> int:
    """Print a shape: link labels, PCIe letters, bandwidths, allocator weights."""
    try:
        shape = load_shape(args.shape)
    except CliError as exc:
        print(f"topoplace topo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(_shape_json(shape), indent=2))
        return EXIT_OK
    gen = PCIE_GEN_BY_GENERATION.get(shape.generation)
    out = [
        f"shape:      {shape.name}",
        f"gpus:       {shape.num_gpus}",
        f"generation: {shape.generation}"
        + (f" (PCIe Gen{gen})" if gen else " (unknown: PCIe Gen3 and NVLink 1.0 rates assumed)"),
        f"assumed:    {'yes' if shape.assumed else 'no'}",
        f"source:     {shape.source}",
    ]
    if shape.numa:
        out.append(f"numa:       {' '.join(str(v) for v in shape.numa)}")
    out.append("")
    out += _matrix("links (topo -m labels):", shape, lambda i, j: shape.links[i][j])
    out.append("")
    out += _matrix("PCIe path:", shape, lambda i, j: shape.pcie[i][j])
    out.append("")
    out += _matrix(
        "bandwidth (GB/s per direction, best path):",
        shape,
        lambda i, j: "-" if i == j else _gbps(shape.bandwidth[i][j]),
    )
    out.append("")
    out += _matrix(
        "go-gpuallocator pair weight (nvidia-best-effort):",
        shape,
        lambda i, j: (
            "-" if i == j else str(allocator_pair_weight(shape.nvlinks[i][j], shape.pcie[i][j]))
        ),
    )
    if shape.num_gpus:
        out.append("")
        for policy in POLICIES:
            row = best_bottlenecks(shape, shape.full_mask(), policy)
            sizes = " ".join(f"{k}:{_gbps(row[k])}" for k in range(2, shape.num_gpus + 1))
            out.append(f"best ring bottleneck by size, all free ({policy}): {sizes}")
    print("\n".join(out))
    return EXIT_OK


def cmd_select(args: argparse.Namespace) -> int:
    """Run one selection; print the set (exit 0) or the refusal (exit 1)."""
    try:
        shape = load_shape(args.topology)
        available = (
            shape.full_mask()
            if args.available is None
            else _parse_indices(args.available, shape, "available")
        )
        required = _parse_indices(args.required, shape, "required") if args.required else 0
    except CliError as exc:
        print(f"topoplace topo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = select_gpus(shape, available, args.size, required, args.policy)
    if result.gpus:
        payload: dict[str, Any] = {
            "gpus": list(result.gpus),
            "score": result.score,
            "bottleneck_gbps": result.bottleneck_gbps,
        }
    else:
        payload = {"gpus": [], "error": result.error}
    if args.json:
        print(json.dumps(payload))
    elif result.gpus:
        print(
            f"gpus {','.join(map(str, result.gpus))}  score {_gbps(result.score)}  "
            f"bottleneck {_gbps(result.bottleneck_gbps)} GB/s  "
            f"({args.policy} on {shape.name})"
        )
    else:
        print(f"refused: {result.error}")
    return EXIT_OK if result.gpus else EXIT_REFUSED


def _add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="topo_command", metavar="{show,select}", required=True)

    show = sub.add_parser("show", help="print a GPU shape's link matrix and bandwidths")
    show.add_argument("shape", metavar="SHAPE_OR_FILE", help="catalog name or topology file")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_show)

    select = sub.add_parser("select", help="choose GPUs on one node with a policy")
    select.add_argument("--topology", required=True, metavar="SHAPE_OR_FILE")
    select.add_argument(
        "--available", metavar="I,J,...", help="free GPU indices (default: all GPUs)"
    )
    select.add_argument("--size", type=int, required=True, help="number of GPUs wanted")
    select.add_argument("--required", metavar="I,J,...", help="GPUs that must be included")
    select.add_argument("--policy", choices=POLICIES, default=POLICIES[0])
    select.add_argument("--json", action="store_true", help="print one JSON object")
    select.set_defaults(func=cmd_select)


def add_parser(subparsers: Any) -> None:
    """Register the ``topo`` sub-command on the main CLI's subparsers object."""
    parser = subparsers.add_parser(
        "topo",
        help="inspect GPU topologies and GPU-set selection",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    _add_commands(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m scheduler.cli.topo {show,select} ...``.

    A leading ``topo`` word is accepted, so the same argv works as with the main CLI.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["topo"]:
        args_list = args_list[1:]
    parser = argparse.ArgumentParser(prog="topoplace topo", description=__doc__)
    _add_commands(parser)
    args = parser.parse_args(args_list)
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `... | head`: the reader left; no traceback (Python docs recipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())

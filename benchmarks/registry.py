"""The benchmark runner: every benchmark registered by name, run with the same flags.

Like kube-scheduler's ``scheduler_perf`` (one runner, workloads as data), a benchmark is a
scenario file (``benchmarks/scenarios/*.yaml``, run on the offline engine) or one small
module registered here. ``topoplace bench --list`` prints the table; ``topoplace bench NAME``
runs one::

    topoplace bench NAME [--out DIR] [--runs N] [--seeds 1-5] [--workers N | --ray ADDR]
                         [--kube-bin DIR] [--write-results] [--quiet] [NAME's own flags]

Common flags (a benchmark that has no use for one refuses it: ``Benchmark.uses``):

* ``--out DIR``: raw output (default ``out/<name>/``, git-ignored);
* ``--runs N``: repetitions (micro benchmarks: timed passes; live: runs);
* ``--seeds SPEC``: seeds, ``1-5`` or ``1,3,7`` (offline scenarios and seeded workloads);
* ``--workers N`` / ``--ray ADDR``: where an offline sweep's runs execute
  (:mod:`benchmarks.sweep`); results do not depend on it;
* ``--kube-bin DIR``: the Kubernetes binaries a live benchmark starts;
* ``--write-results``: also replace ``benchmarks/results/<name>.md`` and ``<name>.csv`` with
  the figures of this run and their conditions (:func:`write_results`);
* ``--quiet``: no progress lines.

A benchmark module provides ``add_arguments(parser)`` (its own flags; optional) and
``bench(args) -> Figures | int`` (or ``run``, when the module has no library function of
that name): :class:`Figures` (the table the results file holds, with
its conditions) or an exit code for benchmarks whose output is a report folder. ``args``
holds the common flags with ``out`` a :class:`~pathlib.Path` and ``runs``/``seeds`` None
when not given (the benchmark's own defaults apply).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
import logging
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from benchmarks import sweep

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
SCENARIO_DIR = REPO / "benchmarks" / "scenarios"

Kind = Literal["offline", "micro", "live"]


@dataclass(frozen=True, slots=True)
class Figures:
    """What one run of a benchmark measured: one table and the conditions it holds under.

    Attributes:
        title: one line naming what the table shows (units included).
        columns: column headers.
        rows: one tuple per row, values in column order (numbers stay numbers for the CSV).
        conditions: what the figures depend on (nodes, pods, runs, seeds, ...), in order;
            the machine and the commit are added by :func:`machine`.
        notes: lines printed under the table (e.g. how a column is computed).
    """

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    conditions: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def markdown(self) -> str:
        """The table in Markdown (floats with 3 significant decimals)."""
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(_cell(v) for v in r) + " |" for r in self.rows]
        return "\n".join(lines)

    def csv_text(self) -> str:
        """The table as CSV (header row first; floats as ``repr``)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.columns)
        w.writerows(self.rows)
        return buf.getvalue()

    def text(self) -> str:
        """Title, conditions, table and notes, as printed after a run."""
        cond = "; ".join(f"{k}: {v}" for k, v in self.conditions.items())
        parts = [self.title, f"conditions: {cond}" if cond else "", self.markdown(), *self.notes]
        return "\n".join(p for p in parts if p)


def _cell(v: Any) -> str:
    """A Markdown cell: whole floats as integers, others with 3 decimals (none from 1,000)."""
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}" if abs(v) >= 1000 else str(int(v))
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


@dataclass(frozen=True, slots=True)
class Benchmark:
    """A registered benchmark.

    Attributes:
        name: what ``topoplace bench NAME`` and the results file are called.
        kind: ``offline`` (the simulator engine), ``micro`` (in-process or loopback
            timing), ``live`` (a real kube-scheduler and API server; needs ``--kube-bin``).
        description: what it measures, one line.
        module: the module providing ``run`` (and optionally ``add_arguments``), imported
            only when the benchmark runs or its help is asked for; for a live benchmark the
            module whose ``main(argv)`` runs it (:func:`run_live` translates the flags).
        seed_flag: a live benchmark's own flag for one seed (``--seed``), "" if it has none.
        uses: the common flags among ``runs seeds workers ray kube_bin`` it takes (space
            separated; live: ``runs kube_bin``, and ``seeds`` with a ``seed_flag``); the
            others are refused rather than ignored.
    """

    name: str
    kind: Kind
    description: str
    module: str
    seed_flag: str = ""
    uses: str = ""

    def takes(self) -> frozenset[str]:
        """The common flags (dest names) this benchmark takes, :attr:`uses` or its kind's."""
        if self.kind == "live":
            return frozenset({"runs", "kube_bin", *(["seeds"] if self.seed_flag else [])})
        return frozenset(self.uses.split())

    @property
    def results_file(self) -> Path:
        """``benchmarks/results/<name>.md``: the current figures (``<name>.csv`` beside)."""
        return RESULTS_DIR / f"{self.name}.md"


_B = Benchmark
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        _B("fgd-openb", "offline", "FGD (ATC '23) sharing policies on the Alibaba openb traces: "
           "GPU allocation and fragmentation vs the paper", "benchmarks.engine.scenarios.fgd.run",
           uses="seeds workers ray"),
        _B("gangs", "offline", "gang placement on NVL72 / DGX H100: CP-SAT vs KAI, Kueue, "
           "first-fit (wait, locality, utilisation)", "benchmarks.engine.scenarios.gangs.run",
           uses="seeds workers ray"),
        _B("faults", "offline", "failure injection at Llama 3 rates: topoplace health vs "
           "Ready-only baselines (goodput, re-placement)", "benchmarks.engine.scenarios.faults.run",
           uses="seeds workers ray"),
        _B("pod-path", "micro", "CPU per pod of the extender's path, stage by stage (watch, "
           "filter, bind, decision record, why line), in process", "benchmarks.micro.pod_path",
           uses="runs"),
        _B("extender-latency", "micro", "filter/prioritize latency over loopback HTTP vs a "
           "parse-only floor; --kind plumbing: server CPU per pod", "benchmarks.micro.extender_latency",
           uses="runs"),
        _B("gang-solver", "micro", "gang plan time and quality on 500-10,000 nodes: CP-SAT vs "
           "the baselines", "benchmarks.micro.gang_solver",
           uses="runs seeds"),
        _B("topology", "micro", "GPU-set table build time and lookup latency per node shape",
           "benchmarks.micro.topology",
           uses="seeds"),
        _B("verb-cost", "micro", "filter+prioritize CPU per pod kind (whole GPU, gang member, "
           "HAMi share, DRA claim, DRA claim (constrained), DRA share); --kind slices: "
           "ResourceSlice events", "benchmarks.micro.verb_cost",
           uses="runs"),
        _B("preemption-latency", "micro", "time of one preempt answer and of a started "
           "preemption's victim search", "benchmarks.micro.preemption_latency",
           uses="runs"),
        _B("sharing-latency", "micro", "per-pod decision time of the GPU-sharing policies at "
           "the openb cluster size", "benchmarks.micro.sharing_latency",
           uses="seeds"),
        _B("background-cpu", "micro", "CPU of the periodic loops: health refresh, parked-pod "
           "poll, remediation check", "benchmarks.micro.background_cpu",
           uses="runs"),
        _B("memory", "micro", "server RSS after many distinct pods; /healthz latency under "
           "gang planning and a 50 MB body", "benchmarks.micro.memory",
           uses=""),
        _B("ui-render", "micro", "cluster view render time in headless Chromium",
           "benchmarks.micro.ui_render",
           uses="runs"),
        _B("rightsize", "offline", "GPU memory right-sizing replayed on the GenAI and Azure LLM "
           "traces: GPUs needed, OOMs, changes vs static limits, VPA, simple rules",
           "benchmarks.rightsize"),
        _B("live-mix", "live", "the mix (or openb) replayed through a real kube-scheduler: "
           "placement vs the offline engine, verb latency", "benchmarks.live.run", "--seed"),
        _B("live-dra", "live", "DRA claim pods through a real kube-scheduler and API server: "
           "topoplace vs the default scheduler", "benchmarks.live.dra"),
        _B("live-fractional", "live", "fractional GPUs (HAMi shares, GPU sharing) live vs "
           "offline", "benchmarks.live.fractional"),
        _B("live-faults", "live", "failure injection replayed live vs offline (health, "
           "re-placement)", "benchmarks.live.faults", "--seed"),
        _B("live-preemption", "live", "preemption live: kube-scheduler's and topoplace's "
           "victims, started preemptions", "benchmarks.live.preemption", "--seed"),
        _B("live-chaos", "live", "faults injected through the real control plane under a "
           "stream of work: invariant violations, recovery per fault kind",
           "benchmarks.live.chaos", "--seed"),
        _B("live-soak", "live", "the chaos stream at a steady load, no faults, for hours: "
           "memory, p99 latency and CPU per pod drift, sizes that could accumulate",
           "benchmarks.live.soak", "--seed"),
    )
}  # fmt: skip
"""Registered benchmarks by name (scenario files come on top: :func:`scenario_files`)."""


def scenario_files() -> dict[str, Path]:
    """Scenario files by the name ``topoplace bench`` runs them under: the file's stem, or
    its path relative to the repository when a registered benchmark has that name (the
    registered one is the same scenario with its own driver)."""
    out: dict[str, Path] = {}
    for p in sorted(SCENARIO_DIR.glob("*.yaml")):
        key = p.stem if p.stem not in BENCHMARKS else str(p.relative_to(REPO))
        out[key] = p
    return out


def listing() -> str:
    """The ``--list`` table: name, kind, what it measures, results file."""
    rows = [
        (b.name, b.kind, b.description, str(b.results_file.relative_to(REPO)))
        for b in BENCHMARKS.values()
    ]
    for name, path in scenario_files().items():
        rows.append((name, "offline", f"scenario file {path.relative_to(REPO)}", "-"))
    width = [
        max(len(r[i]) for r in [("NAME", "KIND", "MEASURES", "RESULTS"), *rows]) for i in (0, 1)
    ]
    head = f"{'NAME':<{width[0]}}  {'KIND':<{width[1]}}  MEASURES  ->  RESULTS"
    return "\n".join(
        [head] + [f"{n:<{width[0]}}  {k:<{width[1]}}  {d}  ->  {r}" for n, k, d, r in rows]
    )


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"1-5"`` -> (1, 2, 3, 4, 5); ``"1,3,7-8"`` -> (1, 3, 7, 8).

    Raises:
        ValueError: empty or malformed.
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out += range(int(lo), int(hi) + 1) if sep else [int(lo)]
    if not out:
        raise ValueError(f"no seeds in {text!r}")
    return tuple(out)


def common_parser(prog: str) -> argparse.ArgumentParser:
    """A parser holding the common flags (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    g = p.add_argument_group("common flags")
    g.add_argument("--out", type=Path, help="raw output directory (default out/<name>/)")
    g.add_argument("--runs", type=int, help="repetitions (default: the benchmark's)")
    g.add_argument("--seeds", help="seeds, e.g. 1-5 or 1,3 (default: the benchmark's)")
    g.add_argument("--seed", dest="seeds", help=argparse.SUPPRESS)  # one seed: the same
    g.add_argument("--kube-bin", type=Path, help="Kubernetes binaries (live benchmarks)")
    g.add_argument("--write-results", action="store_true",
                   help="replace benchmarks/results/<name>.md/.csv with these figures")  # fmt: skip
    g.add_argument("--quiet", action="store_true", help="no progress lines")
    sweep.add_arguments(g)  # type: ignore[arg-type]
    return p


def run_live(b: Benchmark, args: argparse.Namespace, rest: Sequence[str]) -> int:
    """Run live benchmark ``b`` through its module's ``main(argv)``: ``--out``,
    ``--kube-bin`` and ``--runs`` passed on, each seed of ``--seeds`` a run of its own (in
    ``OUT/seed-N`` when there are several), ``rest`` (its own flags) passed as given."""
    main_fn: Callable[[list[str]], int] = importlib.import_module(b.module).main
    base = ["--kube-bin", str(args.kube_bin)] + (["--runs", str(args.runs)] if args.runs else [])
    seeds: tuple[int | None, ...] = (None,)
    if args.seeds:
        if not b.seed_flag:
            print(f"topoplace bench: {b.name} takes no seed", file=sys.stderr)
            return 2
        seeds = parse_seeds(args.seeds)
    rc = 0
    for seed in seeds:
        out = args.out / f"seed-{seed}" if len(seeds) > 1 else args.out
        argv = ["--out", str(out), *base, *([b.seed_flag, str(seed)] if seed is not None else [])]
        rc = rc or main_fn([*argv, *rest])
    return rc


def machine() -> dict[str, str]:
    """The machine and code the figures were measured on: cores, CPU model, Python, commit
    (``-dirty`` when the work tree has uncommitted changes to tracked files)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()  # fmt: skip
        commit += "-dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        "machine": f"{os.cpu_count()} cores, {model}",
        "python": platform.python_version(),
        "commit": commit,
    }


def results_text(b: Benchmark, figures: Figures, command: str, env: Mapping[str, str]) -> str:
    """The Markdown of ``benchmarks/results/<name>.md``, in the folder's format: what it
    measures, the command, the conditions (the figures' and the machine's), the table, its
    notes, the link to the CSV."""
    cond = {**figures.conditions, **env}
    lines = [
        f"# {b.name}",
        "",
        f"{b.description[:1].upper()}{b.description[1:]}.",
        "",
        "Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        "Conditions: " + "; ".join(f"{k}: {v}" for k, v in cond.items()) + ".",
        "",
        f"{figures.title}:",
        "",
        figures.markdown(),
        "",
    ]
    lines += [*(f"- {n}" for n in figures.notes), ""] if figures.notes else []
    lines.append(f"The numbers: [{b.name}.csv]({b.name}.csv).")
    return "\n".join(lines) + "\n"


def write_results(b: Benchmark, figures: Figures, command: str, where: Path = RESULTS_DIR) -> Path:
    """Replace ``<where>/<name>.md`` and ``<name>.csv`` with ``figures``; returns the .md."""
    where.mkdir(parents=True, exist_ok=True)
    md = where / f"{b.name}.md"
    md.write_text(results_text(b, figures, command, machine()))
    (where / f"{b.name}.csv").write_text(figures.csv_text())
    return md


def run(name: str, argv: Sequence[str], *, results_dir: Path = RESULTS_DIR) -> int:
    """Run benchmark ``name`` (a registered name, a scenario file's name or a path) with
    ``argv`` (common flags and the benchmark's own); returns the exit code."""
    files = scenario_files()
    if name not in BENCHMARKS and (name in files or name.endswith((".yaml", ".yml", ".json"))):
        return _run_files([str(files.get(name, name))], argv)
    b = BENCHMARKS.get(name)
    if b is None:
        print(f"topoplace bench: unknown benchmark {name!r} (see topoplace bench --list)",
              file=sys.stderr)  # fmt: skip
        return 2
    p = common_parser(f"topoplace bench {name}")
    p.description = f"{b.description} ({b.kind}; results: {b.results_file.relative_to(REPO)})"
    if b.kind == "live":  # its own flags go to its main as given
        args, rest = p.parse_known_args(list(argv))
        if args.kube_bin is None:
            p.error("a live benchmark needs --kube-bin DIR (kube-apiserver, etcd, kube-scheduler)")
        if args.write_results:
            p.error(
                "a live benchmark writes its report into --out; --write-results is offline only"
            )
        args.out = args.out or Path("out") / name
        return run_live(b, args, rest)
    mod = importlib.import_module(b.module)
    add = getattr(mod, "add_arguments", None)
    if add is not None:
        add(p.add_argument_group(f"{name} flags"))
    args = p.parse_args(list(argv))
    _refuse_unused(p, b, args)
    args.out = args.out or Path("out") / name
    args.out.mkdir(parents=True, exist_ok=True)
    fn: Callable[[argparse.Namespace], Figures | int] = getattr(mod, "bench", None) or mod.run
    # Figures measure the code, not log output: INFO lines (e.g. bind's audit line) are not
    # written, as under a bare interpreter.
    logging.getLogger().setLevel(logging.WARNING)
    result = fn(args)
    if isinstance(result, int):
        if args.write_results:
            print(f"topoplace bench: {name} writes a report folder ({args.out}), not figures; "
                  "--write-results is not supported", file=sys.stderr)  # fmt: skip
            return 2 if result == 0 else result
        return result
    text = result.text()
    (args.out / "figures.md").write_text(text + "\n")
    (args.out / "figures.csv").write_text(result.csv_text())
    print(text)
    if args.write_results:
        command = "topoplace bench " + shlex.join([name, *_reproducing(argv)])
        print(f"wrote {write_results(b, result, command, results_dir)}")
    return 0


COMMON = ("runs", "seeds", "workers", "ray", "kube_bin")
"""Common flags a benchmark may or may not take (``--out``, ``--quiet`` and
``--write-results`` apply to all)."""


def _refuse_unused(p: argparse.ArgumentParser, b: Benchmark, args: argparse.Namespace) -> None:
    """``p.error`` (exit 2) for a common flag ``b`` does not take."""
    unused = [f for f in COMMON if getattr(args, f, None) is not None and f not in b.takes()]
    if unused:
        flags = ", ".join("--" + f.replace("_", "-") for f in unused)
        p.error(f"{b.name} does not take {flags}")


def _reproducing(argv: Sequence[str]) -> list[str]:
    """``argv`` without what does not change the figures (``--out DIR``, ``--quiet``,
    ``--write-results``)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith(("--out=", "--quiet", "--write-results")):
            out.append(a)
    return out


def _run_files(files: Sequence[str], argv: Sequence[str]) -> int:
    from benchmarks.engine.run import main_files

    p = common_parser("topoplace bench FILE")
    args = p.parse_args(list(argv))
    for flag in ("runs", "seeds", "kube_bin"):
        if getattr(args, flag):
            p.error(f"a scenario file sets its own {flag.replace('_', '-')} (edit the file)")
    if args.write_results:
        p.error("--write-results is for registered benchmarks; a scenario file writes --out")
    out = args.out or Path("out") / Path(files[0]).stem
    try:
        with sweep.from_args(args) as executor:
            return main_files(files, str(out), executor, quiet=args.quiet,
                              command="topoplace bench " + shlex.join([*files, *argv]))  # fmt: skip
    except sweep.SweepError as exc:
        print(f"topoplace bench: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """``topoplace bench`` (and ``python -m benchmarks.registry``): ``--list``, or ``NAME
    [flags]``, or several scenario files ``FILE... [flags]`` run together."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("--list", "-l", "list"):
        print(listing())
        return 0 if args else 2
    if args[0] in ("-h", "--help"):
        print(__doc__)
        print(listing())
        return 0
    files = [a for a in args if a.endswith((".yaml", ".yml", ".json")) and not a.startswith("-")]
    if len(files) > 1 and args[: len(files)] == files:
        return _run_files(files, args[len(files) :])
    return run(args[0], args[1:])


if __name__ == "__main__":
    raise SystemExit(main())

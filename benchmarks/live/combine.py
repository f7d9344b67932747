"""One table over several live-benchmark result folders (``python -m benchmarks.live.combine``).

A live figure on the shared 2-core host moves with the minute: default-scheduler alone
went from 156 to 237 pods/s between two runs of one session. So a claim rests on many runs,
often spread over several ``--out`` folders (one per invocation). This reads their
``runs.csv`` files, as :mod:`benchmarks.live.run` writes them, and prints, per arm:

* pods/s: median and range over all runs;
* CPU per pod of every process of the arm (topoplace, kube-scheduler, kube-apiserver,
  etcd) and of all of them together, medians;

and, for ``topoplace`` against each other arm:

* the ratio of the median pods/s;
* the per-run ratios (topoplace's run N over the other arm's run N of the same folder:
  adjacent in time, so a slow spell of the host lands on both sides), median and range,
  and how many are at least ``--line`` (0.7 by default, issue 11's bar);
* the CPU ratio: the other arm's median CPU per pod, all processes, over topoplace's. On
  a saturated host pods/s follows it (both arms keep the 2 cores about 97 % busy);
* live against offline, where the runs replayed offline (the replay's own ``offline`` row is
  left out of the tables): pods on the offline node
  (fewest over runs) and the distinct (nodes used, whole nodes free) pairs.

Run: ``python -m benchmarks.live.combine DIR [DIR ...] [--line 0.7]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

PROCESSES = (
    ("topoplace", "cpu_topoplace_s"),
    ("kube-scheduler", "cpu_kube_scheduler_s"),
    ("kube-apiserver", "cpu_apiserver_s"),
    ("etcd", "cpu_etcd_s"),
)
"""The processes of an arm whose CPU ``runs.csv`` records, with their column."""

Row = Mapping[str, str]


def _num(row: Row, key: str) -> float:
    text = (row.get(key) or "").strip()
    try:
        return float(text)
    except ValueError:
        return math.nan


def load(folders: Sequence[Path]) -> list[dict[str, str]]:
    """The rows of every folder's ``runs.csv``, each with ``folder`` set.

    Raises:
        FileNotFoundError: a folder has no ``runs.csv``.
        ValueError: a ``runs.csv`` lacks the ``arm``, ``run`` or ``pods_per_s`` column.
    """
    rows: list[dict[str, str]] = []
    for folder in folders:
        path = folder / "runs.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no runs.csv (not a live-benchmark result)")
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = {"arm", "run", "pods_per_s"} - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{path}: no column {', '.join(sorted(missing))}")
            for row in reader:
                if row["arm"] == "offline":  # the offline replay's row: no pods/s, no CPU
                    continue
                rows.append({**row, "folder": str(folder)})
    return rows


def cpu_ms_per_pod(row: Row, column: str) -> float:
    """CPU milliseconds per bound pod of one process in one run (nan if not recorded)."""
    pods = _num(row, "pods_bound")
    cpu = _num(row, column)
    if not pods or math.isnan(pods) or math.isnan(cpu):
        return math.nan
    return cpu / pods * 1000.0


def arm_cpu_ms_per_pod(row: Row) -> float:
    """CPU milliseconds per bound pod of all the arm's processes together (an arm without
    topoplace records none for it: that process is not part of the arm)."""
    parts = [cpu_ms_per_pod(row, col) for _, col in PROCESSES]
    known = [p for p in parts if not math.isnan(p)]
    return sum(known) if known else math.nan


def _median(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def paired(rows: Sequence[Row], arm: str) -> list[tuple[Row, Row]]:
    """(topoplace row, ``arm`` row) of the same run in the same folder."""
    by_key = {(r["folder"], r["run"]): r for r in rows if r["arm"] == "topoplace"}
    return [
        (by_key[(r["folder"], r["run"])], r)
        for r in rows
        if r["arm"] == arm and (r["folder"], r["run"]) in by_key
    ]


def _fmt(v: float, nd: int = 2) -> str:
    return "-" if math.isnan(v) else f"{v:.{nd}f}"


def report(rows: Sequence[Row], line: float = 0.7) -> str:
    """The combined tables, as Markdown."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    folders = list(dict.fromkeys(r["folder"] for r in rows))
    out = [f"{len(folders)} folder(s): {', '.join(folders)}", ""]
    head = "| arm | runs | pods/s median (range) |"
    head += "".join(f" CPU ms/pod {name} |" for name, _ in PROCESSES) + " CPU ms/pod, all |"
    out += [head, "|---" * (4 + len(PROCESSES)) + "|"]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        speed = [_num(r, "pods_per_s") for r in mine]
        cells = [_fmt(_median([cpu_ms_per_pod(r, col) for r in mine])) for _, col in PROCESSES]
        out.append(
            f"| {arm} | {len(mine)} | {_fmt(_median(speed), 1)} "
            f"({_fmt(min(speed), 1)}-{_fmt(max(speed), 1)}) | "
            + " | ".join(cells)
            + f" | {_fmt(_median([arm_cpu_ms_per_pod(r) for r in mine]))} |"
        )
    if "topoplace" in arms:
        out += ["", f"topoplace against each other arm (bar: {line}x):", ""]
        out.append(
            "| against | ratio of medians | per-run ratios: median (range) | "
            f"runs at or over {line}x | CPU ratio (all processes) |"
        )
        out.append("|---|---|---|---|---|")
        tp_rows = [r for r in rows if r["arm"] == "topoplace"]
        tp_speed = _median([_num(r, "pods_per_s") for r in tp_rows])
        tp_cpu = _median([arm_cpu_ms_per_pod(r) for r in tp_rows])
        for arm in arms:
            if arm == "topoplace":
                continue
            mine = [r for r in rows if r["arm"] == arm]
            ratios = [
                _num(a, "pods_per_s") / _num(b, "pods_per_s")
                for a, b in paired(rows, arm)
                if _num(b, "pods_per_s")
            ]
            ratios = [x for x in ratios if not math.isnan(x)]
            speed = _median([_num(r, "pods_per_s") for r in mine])
            cpu = _median([arm_cpu_ms_per_pod(r) for r in mine])
            spread = f"{_fmt(min(ratios))}-{_fmt(max(ratios))}" if ratios else "-"
            over = sum(x >= line for x in ratios)
            out.append(
                f"| {arm} | {_fmt(tp_speed / speed)}x | {_fmt(_median(ratios))}x ({spread}) | "
                f"{over} of {len(ratios)} | {_fmt(cpu / tp_cpu)} |"
            )
        # runs.csv holds -1 (or nothing) where a run was not replayed offline (--no-offline)
        replayed = [r for r in tp_rows if _num(r, "same_node_as_offline") >= 0]
        if replayed:
            same = min(int(_num(r, "same_node_as_offline")) for r in replayed)
            shapes = sorted(
                {(r.get("nodes_used", ""), r.get("whole_nodes_free", "")) for r in replayed}
            )
            out += [
                "",
                f"live against offline ({len(replayed)} topoplace runs replayed offline): "
                f"at least {same} pods on the offline node in every run; nodes used / whole "
                "nodes free: " + ", ".join(f"{u} / {w}" for u, w in shapes),
            ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="result folders (each with runs.csv)")
    ap.add_argument("--line", type=float, default=0.7, help="the pods/s ratio to count runs at")
    args = ap.parse_args(argv)
    try:
        rows = load(args.folders)
    except (FileNotFoundError, ValueError) as exc:
        ap.error(str(exc))
    if not rows:
        ap.error("no runs in those folders")
    print(report(rows, args.line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

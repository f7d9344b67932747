"""``topoplace rightsize replay``: the right-sizer on a recorded series, offline; and
``topoplace rightsize show [POD] [--url URL]``: what a running extender's right-sizer
recommends now (every workload, or POD's), with the reason.

Fixed interface (evaluations outside the project call exactly this)::

    topoplace rightsize replay --series SERIES.csv [--policy FILE] --out DIR

``SERIES.csv`` columns (header required, any order, extra columns ignored): ``timestamp``
(seconds), ``workload``, ``pod``, ``container``, ``metric``, ``value``. ``metric`` is
``gpu_memory_used_bytes`` (bytes) or ``gpu_utilization_ratio`` (0..1); the recommender also
reads ``kv_cache_usage_ratio``, ``kv_cache_capacity_bytes``, ``requests_waiting``,
``latency_seconds`` and ``oom_events`` (``scheduler.core.rightsize.METRICS``). Rows need not be
sorted. Output: ``DIR/recommendations.csv`` (``timestamp, workload, pod, container,
gpu_memory_limit_bytes, gpu_compute_ratio, mode``: each row the recommendation in force for
that container from ``timestamp`` on, decided only from samples before it) and
``DIR/summary.md`` (per workload: final size, mode, reason, changes, OOMs). Exit status 0, or
2 with ``topoplace: error: FILE:LINE: ...`` for a bad file.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from scheduler.core.rightsize import (
    METRICS,
    RATIO_METRICS,
    GiB,
    PolicySet,
    RightsizeError,
    Row,
    Sample,
    policies_from_dict,
    replay,
    workloads_summary,
)

COLUMNS = ("timestamp", "workload", "pod", "container", "metric", "value")
OUT_COLUMNS = (
    "timestamp",
    "workload",
    "pod",
    "container",
    "gpu_memory_limit_bytes",
    "gpu_compute_ratio",
    "mode",
)


class SeriesError(ValueError):
    """A malformed series or policy file; the message starts with ``FILE:LINE:``."""


def read_series(path: str | Path) -> list[Sample]:
    """The samples of a series CSV, sorted by timestamp (stable: file order within one).

    Raises:
        SeriesError: missing file or column, unknown metric, non-numeric or out-of-range
            value, with the file name and line number.
    """
    p = Path(path)
    try:
        fh = p.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise SeriesError(f"{p}: cannot read: {exc.strerror}") from None
    out: list[Sample] = []
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise SeriesError(f"{p}:1: empty file; expected a header {','.join(COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise SeriesError(
                f"{p}:1: missing column(s) {', '.join(missing)}; header is {','.join(header)}"
            )
        idx = [header.index(c) for c in COLUMNS]
        known = set(METRICS)
        for line, rec in enumerate(reader, start=2):
            if not rec or all(not f.strip() for f in rec):
                continue
            if len(rec) < len(header):
                raise SeriesError(f"{p}:{line}: {len(rec)} fields, the header has {len(header)}")
            ts, wl, pod, ctr, metric, val = (rec[i].strip() for i in idx)
            if metric not in known:
                raise SeriesError(
                    f"{p}:{line}: unknown metric {metric!r}; known: {', '.join(METRICS)}"
                )
            t = _number(ts, p, line, "timestamp")
            v = _number(val, p, line, "value")
            if v < 0 or (metric in RATIO_METRICS and v > 1):
                bound = "0..1" if metric in RATIO_METRICS else ">= 0"
                raise SeriesError(f"{p}:{line}: value {val!r} of {metric} is not {bound}")
            if not wl:
                raise SeriesError(f"{p}:{line}: empty workload")
            out.append(Sample(t, wl, pod, ctr, metric, v))
    out.sort(key=lambda s: s.timestamp)
    return out


def _number(text: str, p: Path, line: int, column: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise SeriesError(f"{p}:{line}: {column} {text!r} is not a number") from None
    if not math.isfinite(x):
        raise SeriesError(f"{p}:{line}: {column} {text!r} is not finite")
    return x


def load_policies(path: str | Path | None) -> PolicySet:
    """The policy file (YAML: ``default``, ``namespaces``, ``workloads``), or the defaults.

    Raises:
        SeriesError: unreadable or malformed file.
    """
    if path is None:
        return PolicySet()
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SeriesError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SeriesError(f"{path}: not YAML: {exc}") from None
    try:
        return policies_from_dict(data)
    except RightsizeError as exc:
        raise SeriesError(f"{path}: {exc}") from None


def _timestamp(t: float) -> str:
    """Seconds as written: whole seconds without a fraction, others exactly (``repr``)."""
    return str(int(t)) if t.is_integer() else repr(t)


def write_outputs(out: Path, rows: list[Row], summary: str) -> None:
    """``recommendations.csv`` and ``summary.md`` in ``out`` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "recommendations.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(OUT_COLUMNS)
        for r in rows:
            w.writerow(
                [
                    _timestamp(r.timestamp),
                    r.workload,
                    r.pod,
                    r.container,
                    r.gpu_memory_limit_bytes,
                    f"{r.gpu_compute_ratio:g}",
                    r.mode,
                ]
            )
    (out / "summary.md").write_text(summary, encoding="utf-8")


def render_summary(series: str, rows: list[Row], rec: Any) -> str:
    """Markdown: one line per workload with its final size, mode, changes, OOM raises and the
    reason."""
    changes: Counter[str] = Counter()
    ooms: Counter[str] = Counter()
    seen: dict[str, float] = {}
    oom_at: dict[str, float] = {}
    for r in rows:
        if r.workload in seen and seen[r.workload] != r.timestamp:
            changes[r.workload] += 1
        seen[r.workload] = r.timestamp
        if r.oom and oom_at.get(r.workload) != r.timestamp:
            ooms[r.workload] += 1
            oom_at[r.workload] = r.timestamp
    lines = [
        "# Right-sizing replay",
        "",
        f"Series: `{series}`; {len(rows)} recommendation rows; "
        f"{len(rec.states)} workloads. Each row is in force from its timestamp, decided from "
        "samples before it.",
        "",
        "| workload | GPU memory limit (GiB) | compute | mode | changes | OOM raises | why |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for r in workloads_summary(rec):
        lines.append(
            f"| {r.workload} | {r.gpu_memory_limit_bytes / GiB:.2f} | {r.gpu_compute_ratio:g} "
            f"| {r.mode} | {changes[r.workload]} | {ooms[r.workload]} | {r.reason} |"
        )
    return "\n".join(lines) + "\n"


def run_replay(series: str, policy: str | None, out: str) -> int:
    """The ``replay`` verb: read, replay, write. Raises :class:`SeriesError` on bad input."""
    samples = read_series(series)
    policies = load_policies(policy)
    try:
        rows, rec = replay(samples, policies)
    except RightsizeError as exc:
        raise SeriesError(f"{series}: {exc}") from None
    write_outputs(Path(out), rows, render_summary(series, rows, rec))
    print(
        f"{len(rows)} rows for {len(rec.states)} workloads -> {Path(out) / 'recommendations.csv'}"
    )
    return 0


def fetch_show(url: str, pod: str | None, client: Any = None) -> dict[str, Any]:
    """What a running extender's right-sizer says: every workload
    (``GET /v1/inspect/rightsize``), or the recommendation for ``pod``'s workload (the
    ``rightsize`` part of ``GET /v1/inspect/decisions?pod=``).

    Raises:
        SeriesError: unreachable extender, an HTTP error, or POD not NAMESPACE/NAME.
    """
    import httpx

    base = url.rstrip("/")
    own = client is None
    c = client or httpx.Client(timeout=30)
    try:
        if pod is None:
            r = c.get(base + "/v1/inspect/rightsize")
        else:
            if pod.count("/") != 1 or not all(pod.split("/")):
                raise SeriesError(f"POD must be NAMESPACE/NAME, got {pod!r}")
            r = c.get(base + "/v1/inspect/decisions", params={"pod": pod, "limit": 1})
    except httpx.HTTPError as exc:
        raise SeriesError(f"cannot reach the extender at {url}: {exc}") from None
    finally:
        if own:
            c.close()
    if r.status_code != 200:
        raise SeriesError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
    body: dict[str, Any] = r.json()
    if pod is None:
        return body
    return {"pod": pod, **(body.get("rightsize") or {"why_not": "the right-sizer is off"})}


def render_show(found: dict[str, Any]) -> list[str]:
    """Plain-text lines of :func:`fetch_show`'s answer."""

    def one(w: dict[str, Any]) -> str:
        return (
            f"{w['workload']}: {w['gpu_memory_limit_bytes'] / GiB:.1f} GiB GPU memory, "
            f"{w['gpu_compute_ratio']:.0%} of the SMs, {w['mode']}\n  why: {w['reason']}"
        )

    if "pod" in found:
        if "why_not" in found:
            return [f"{found['pod']}: {found['why_not']}"]
        return [f"{found['pod']} -> {one(found)}"]
    if found.get("mode") is None:
        return [str(found.get("why_not", "the right-sizer is off"))]
    lines = [
        f"right-sizer: mode {found['mode']}, Prometheus {found['prometheus']}, "
        f"reads {found['reads']}, evictions {found['evictions']}"
    ]
    if found.get("last_error"):
        lines.append(f"  last error: {found['last_error']}")
    lines += [one(w) for w in found.get("workloads") or ()] or ["no recommendation yet"]
    return lines


def rightsize_lines(found: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """The right-size line of a ``GET /v1/inspect/decisions?pod=`` answer (its
    ``rightsize`` part), for ``topoplace explain``'s text; [] when the extender runs no
    right-sizer."""
    rs = found.get("rightsize")
    if not isinstance(rs, Mapping):
        return []
    if "why_not" in rs:
        return [f"{indent}right-size: {rs['why_not']}"]
    return [
        f"{indent}right-size: {rs['workload']} gets {rs['gpu_memory_limit_bytes'] / GiB:.1f} GiB"
        f" GPU memory, {rs['gpu_compute_ratio']:.0%} of the SMs, {rs['mode']} ({rs['reason']})"
    ]


def _cmd(args: argparse.Namespace) -> int:
    if args.rightsize_command == "show":
        try:
            found = fetch_show(args.url, args.pod)
        except SeriesError as exc:
            print(f"topoplace: error: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(found, indent=2, sort_keys=True))
        else:
            print("\n".join(render_show(found)))
        return 0 if "why_not" not in found else 1
    if args.rightsize_command != "replay":
        args.rightsize_parser.print_help()
        return 2
    try:
        return run_replay(args.series, args.policy, args.out)
    except SeriesError as exc:
        print(f"topoplace: error: {exc}", file=sys.stderr)
        return 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``rightsize`` with its ``replay`` verb."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "rightsize",
        help="GPU share right-sizer (offline replay of recorded series)",
        description=__doc__.split("Fixed interface")[0].strip() if __doc__ else None,
    )
    verbs = p.add_subparsers(dest="rightsize_command", metavar="VERB")
    r = verbs.add_parser(
        "replay",
        help="recommendations from a recorded series (CSV)",
        description="Replay SERIES.csv through the right-sizer; see docs/rightsizing.md.",
    )
    r.add_argument("--series", required=True, metavar="SERIES.csv", help="the recorded series")
    r.add_argument("--policy", metavar="FILE", help="policy YAML (default: built-in defaults)")
    r.add_argument("--out", required=True, metavar="DIR", help="output directory")
    sh = verbs.add_parser(
        "show",
        help="a running extender's recommendations (all workloads, or POD's)",
        description="What the right-sizer of `topoplace serve` recommends now, and why.",
    )
    sh.add_argument("pod", nargs="?", metavar="POD", help="NAMESPACE/NAME: its workload only")
    sh.add_argument("--url", default="http://127.0.0.1:8888", help="the extender")
    sh.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(func=_cmd, rightsize_parser=p, rightsize_command=None)
    r.set_defaults(func=_cmd, rightsize_parser=p, rightsize_command="replay")
    sh.set_defaults(func=_cmd, rightsize_parser=p, rightsize_command="show")
    return p


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m scheduler.cli.rightsize replay ...``)."""
    parser = argparse.ArgumentParser(prog="topoplace")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

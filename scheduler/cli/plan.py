"""``topoplace plan``: place whole gangs on a cluster file, offline.

Example::

    topoplace plan --cluster config/clusters/demo.yaml \\
        --gang train:16x4:required=nvlink-domain --gang ft:2x8:preferred=leaf

Each ``--gang`` is ``NAME:PODSxGPUS[:required=LEVEL][:preferred=LEVEL][:cpu=Q][:memory=Q]
[:priority=N][:role=R]`` (``NAME`` may be ``namespace/name``; the default namespace is
``default``). Gangs are planned jointly in priority order, each seeing the reservations of
the ones before (:func:`scheduler.core.gang.plan_gangs`). The output lists, per gang, the
node and GPU indices of every member, the domains used per fabric level against the exact
lower bound, the collective bandwidth estimate, and the solver record. Exit status: 0 when
every gang is placed, 1 when one is refused, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from scheduler.core.gang import GangRequest, plan_gangs, simple_gang
from scheduler.core.objects import ObjectError, map_level
from scheduler.core.params import SchedParams
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.schedule import PlacementResult

GANG_HELP = (
    "NAME:PODSxGPUS[:required=LEVEL][:preferred=LEVEL][:cpu=Q][:memory=Q][:priority=N]"
    "[:role=R], e.g. train:16x4:required=nvlink-domain (repeatable)"
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``plan`` sub-command."""
    from scheduler.core.policies.registry import DEFAULT_GANG_POLICY

    p: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="place whole gangs on a cluster file (all or nothing)",
        description=__doc__.split("Example::")[0].strip() if __doc__ else None,
    )
    p.add_argument("--cluster", help="cluster file (a Kubernetes List); required")
    p.add_argument("--gang", action="append", metavar="SPEC", help=GANG_HELP + "; required")
    p.add_argument(
        "--policy",
        default=None,
        help=f"gang policy (default: the policy file's placement_policy, else {DEFAULT_GANG_POLICY}); "
        "see --list-policies",
    )
    p.add_argument("--config", help="policy YAML (default: the shipped config/policy.yaml)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--list-policies", action="store_true", help="print the gang policies and exit")
    p.set_defaults(func=run)
    return p


def parse_gang(spec: str, params: SchedParams) -> GangRequest:
    """A gang from ``NAME:PODSxGPUS[:key=value...]``.

    Raises:
        ValueError: malformed spec, with what was expected.
    """
    parts = spec.split(":")
    if len(parts) < 2 or not parts[0]:
        raise ValueError(f"--gang {spec!r}: expected {GANG_HELP.split(',')[0]}")
    name = parts[0] if "/" in parts[0] else f"default/{parts[0]}"
    size = parts[1].lower().split("x")
    try:
        pods, gpus = int(size[0]), int(size[1])
    except (ValueError, IndexError):
        raise ValueError(f"--gang {spec!r}: size must be PODSxGPUS, e.g. 16x4") from None
    if pods < 1 or gpus < 0:
        raise ValueError(f"--gang {spec!r}: need at least one pod and GPUs >= 0")
    opts: dict[str, str] = {}
    for kv in parts[2:]:
        k, sep, v = kv.partition("=")
        if not sep or k not in ("required", "preferred", "cpu", "memory", "priority", "role"):
            raise ValueError(
                f"--gang {spec!r}: unknown option {kv!r}; expected required=, preferred=, "
                "cpu=, memory=, priority=, role="
            )
        opts[k] = v
    try:
        req = map_level(opts["required"], params.fabric) if opts.get("required") else ""
        pref = map_level(opts["preferred"], params.fabric) if opts.get("preferred") else ""
    except ObjectError as exc:
        raise ValueError(f"--gang {spec!r}: {exc}") from None
    return simple_gang(
        name,
        pods,
        gpus,
        required=req,
        preferred=pref,
        cpu_milli=cpu_milli(opts.get("cpu"), 0) if opts.get("cpu") else 0,
        memory_bytes=quantity_int(opts.get("memory"), 0) if opts.get("memory") else 0,
        role=opts.get("role") or "worker",
        priority=int(opts.get("priority") or 0),
    )


def _load_cluster(path: str) -> tuple[list[Any], list[Any], dict[str, Any]]:
    from scheduler.cli.clusterfile import load_cluster

    nodes, pods, extra = load_cluster(path)
    return list(nodes), list(pods), dict(extra)


def _load_params(path: str | None) -> SchedParams:
    from scheduler.cli.clusterfile import load_policy

    return SchedParams.from_config(load_policy(path))


def result_json(gang: GangRequest, res: PlacementResult) -> dict[str, Any]:
    """One gang's result as plain JSON."""
    return {
        "gang": gang.key,
        "ok": res.ok,
        "reason": res.reason,
        "request": gang.describe(),
        "assignments": [
            {"pod": a.pod, "node": a.node, "gpus": list(a.gpus)} for a in res.assignments
        ],
        "details": res.details,
    }


def _fmt_num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def render(gang: GangRequest, res: PlacementResult) -> str:
    """Human-readable report of one gang's result."""
    d = res.details
    lines = []
    cons = []
    if gang.topology.required:
        cons.append(f"required {gang.topology.required}")
    if gang.topology.preferred:
        cons.append(f"preferred {gang.topology.preferred}")
    head = f"gang {gang.key}: {gang.describe()}" + (f" ({', '.join(cons)})" if cons else "")
    if not res.ok:
        lines.append(f"{head}: REFUSED")
        lines.append(f"  reason: {res.reason}")
    else:
        lines.append(f"{head}: placed")
        used = d.get("domains_used", {})
        lb = d.get("lower_bound", {})
        nested = d.get("lower_bound_nested", {})
        levels = list(used)
        parts = []
        for i, (k, v) in enumerate(used.items()):
            note = f"lower bound {lb.get(k, '?')}"
            parent = levels[i + 1] if i + 1 < len(levels) else None
            nb = nested.get(k, {}).get(str(lb.get(parent))) if parent else None
            if nb is not None and nb != lb.get(k):
                note += f"; {nb} within the fewest {parent} domains"
            parts.append(f"{k} {v} ({note})")
        doms = ", ".join(parts)
        lines.append(f"  domains used: {doms}")
        lines.append(
            f"  collective bandwidth estimate: {_fmt_num(d.get('collective_bandwidth_gbps', 0))} GB/s"
        )
    rec = [f"policy {d.get('policy', '?')}", f"status {d.get('status', '?')}"]
    for k in ("objective", "bound", "gap", "solve_time_ms"):
        if d.get(k) is not None:
            rec.append(f"{k} {_fmt_num(d[k])}")
    solver = d.get("solver")
    if isinstance(solver, dict):
        rec.append(
            f"seed {solver.get('seed')}, workers {solver.get('workers')}, "
            f"deterministic limit {solver.get('max_deterministic_time')} s"
        )
    lines.append("  solver: " + "; ".join(rec))
    if res.assignments:
        w = max(len(a.pod) for a in res.assignments)
        nw = max(len(a.node) for a in res.assignments)
        lines.append(f"  {'pod'.ljust(w)}  {'node'.ljust(nw)}  gpus")
        for a in res.assignments:
            lines.append(
                f"  {a.pod.ljust(w)}  {a.node.ljust(nw)}  {','.join(map(str, a.gpus)) or '-'}"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``topoplace plan``; returns the exit status."""
    from scheduler.core.policies.registry import (
        DEFAULT_GANG_POLICY,
        GANG_POLICIES,
        get_policy,
        policy_names,
    )
    from scheduler.core.snapshot import build_snapshot

    if getattr(args, "list_policies", False):
        print("\n".join(policy_names()))
        return 0
    if not args.cluster or not args.gang:
        print(
            "topoplace plan: error: --cluster and at least one --gang are required",
            file=sys.stderr,
        )
        return 2
    try:
        params = _load_params(args.config)
        gangs = [parse_gang(s, params) for s in args.gang]
        name = args.policy
        if not name:
            get_policy(DEFAULT_GANG_POLICY)
            name = (
                params.placement_policy
                if params.placement_policy in GANG_POLICIES
                else DEFAULT_GANG_POLICY
            )
        get_policy(name)
        nodes, pods, extra = _load_cluster(args.cluster)
    except ValueError as exc:
        print(f"topoplace plan: error: {exc}", file=sys.stderr)
        return 2
    snap = build_snapshot(nodes, pods, params, extra)
    results = plan_gangs(snap, gangs, params, name)
    if args.json:
        out = [result_json(g, r) for g, r in zip(gangs, results, strict=True)]
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print("\n\n".join(render(g, r) for g, r in zip(gangs, results, strict=True)))
    return 0 if all(r.ok for r in results) else 1

"""``topoplace explain POD``: why a pod is where it is, or why it is pending.

Online (default): asks a running extender's inspect API
(``GET /v1/inspect/decisions?pod=NAMESPACE/NAME``), which explains the decisions it made
for the pod from the snapshot each was made on. Offline (``--cluster FILE``): explains the
pod of a cluster file from that file: a bound pod against the cluster without it (would
topoplace have put it there, with which score, and who came next), a pending pod as the
extender would decide it now, a pending gang member by planning its gang.

Plain text for people, ``--json`` for tools. Exit status: 0 explained, 1 no decision held
for the pod (online) or the pod is not in the file, 2 bad input or an unreachable
extender.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import orjson

from scheduler.cli.rightsize import rightsize_lines
from scheduler.core.explain import PARTS

DEFAULT_URL = "http://127.0.0.1:8888"


class ExplainError(ValueError):
    """Bad input or an unreachable extender: one line on stderr, exit status 2."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``explain`` sub-command."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "explain",
        help="why a pod is where it is, or why it is pending",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("pod", metavar="POD", help="NAMESPACE/NAME (or NAME with -n)")
    p.add_argument("-n", "--namespace", default="default", help="namespace of a bare NAME")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the extender (default {DEFAULT_URL})")
    p.add_argument("--cluster", help="explain offline from this cluster file instead")
    p.add_argument("--config", help="policy YAML for --cluster (default: the shipped one)")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--limit", type=int, default=20, help="records to fetch (online)")
    p.add_argument("--cacert", help="CA bundle to verify the extender's certificate")
    p.add_argument("--cert", help="client certificate (mTLS)")
    p.add_argument("--key", help="key of --cert")
    p.set_defaults(func=run)
    return p


def _pod_key(args: argparse.Namespace) -> str:
    key = args.pod if "/" in args.pod else f"{args.namespace}/{args.pod}"
    ns, _, name = key.partition("/")
    if not ns or not name or "/" in name:
        raise ExplainError(f"POD must be NAMESPACE/NAME, got {args.pod!r}")
    return key


def run(args: argparse.Namespace) -> int:
    """Entry point of ``topoplace explain``."""
    key = _pod_key(args)
    if args.cluster:
        found = explain_offline(key, args.cluster, args.config)
    else:
        found = fetch(key, args)
    if args.json:
        print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(render(found)))
    return 0 if found.get("decisions") else 1


def fetch(key: str, args: argparse.Namespace) -> dict[str, Any]:
    """The decision records of ``key`` from a running extender."""
    import httpx

    verify: Any = args.cacert or True
    cert = (args.cert, args.key) if args.cert else None
    url = args.url.rstrip("/") + "/v1/inspect/decisions"
    try:
        with httpx.Client(verify=verify, cert=cert, timeout=30) as client:
            r = client.get(url, params={"pod": key, "limit": args.limit})
    except httpx.HTTPError as exc:
        raise ExplainError(f"cannot reach the extender at {args.url}: {exc}") from None
    if r.status_code != 200:
        raise ExplainError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
    body: dict[str, Any] = r.json()
    body["source"] = args.url
    return body


def explain_offline(key: str, cluster: str, config: str | None) -> dict[str, Any]:
    """Explain ``key`` from a cluster file (see the module docstring)."""
    import numpy as np

    from scheduler.cli.clusterfile import load_cluster, load_params
    from scheduler.core.explain import explain
    from scheduler.core.objects import object_key, request_from_pod
    from scheduler.core.snapshot import build_snapshot

    params = load_params(config)
    nodes, pods, extra = load_cluster(cluster)
    pod = next((p for p in pods if object_key(p) == key), None)
    out: dict[str, Any] = {"pod": key, "source": cluster, "decisions": []}
    if pod is None:
        out["error"] = f"no pod {key} in {cluster}"
        return out
    req = request_from_pod(pod, params.fabric)
    bound_to = (pod.get("spec") or {}).get("nodeName") or None
    others = [p for p in pods if object_key(p) != key]
    snap = build_snapshot(nodes, others, params, extra)
    if req.gpus <= 0:
        out["error"] = f"{key} asks for no GPUs: topoplace does not place it"
        return out
    if req.gang and not bound_to:
        out["decisions"].append(_gang_offline(snap, req, pods, params))
        return out
    from scheduler.core.fractional import is_share_pod

    if is_share_pod(pod):
        out["decisions"].append(_share_offline(pod, snap, params, bound_to))
        return out
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    exp = explain(snap, req, pos, params, "filter", chosen=bound_to)
    exp["verb"] = "offline" if not bound_to else "offline (bound pod, cluster without it)"
    out["decisions"].append(exp)
    return out


def _share_offline(pod: Any, snap: Any, params: Any, bound_to: str | None) -> dict[str, Any]:
    """A fractional pod, as the extender's prioritize would score it on the cluster
    without it (every node a candidate): the sharing policy's record."""
    from scheduler.core.objects import object_key
    from scheduler.runtime.cache import ClusterCache
    from scheduler.server.decisions import info_summary
    from scheduler.server.extender import Extender
    from scheduler.server.metrics import Metrics

    ext = Extender(ClusterCache(snap, params), None, Metrics())
    key = object_key(pod)
    ext.prioritize_json({"Pod": pod, "NodeNames": list(snap.names)})
    rec = next((r for r in ext.decisions.records(key) if r.info.get("kind") == "share"), None)
    if rec is None:
        return {"pod": key, "verb": "offline", "summary": "no sharing decision recorded"}
    info = dict(rec.info)
    verb = "offline" if not bound_to else "offline (bound pod, cluster without it)"
    return {"pod": key, "verb": verb, **info, "summary": info_summary("prioritize", "", info)}


def _gang_offline(snap: Any, req: Any, pods: list[Any], params: Any) -> dict[str, Any]:
    """Plan the pending members of ``req``'s gang in the file, as the extender would."""
    from scheduler.core.gang import GangSizeError, gang_request, gang_size, group_topology
    from scheduler.core.objects import ObjectError, request_from_pod
    from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, GANG_POLICIES, get_policy
    from scheduler.server.decisions import info_summary

    members = []
    for p in pods:
        try:
            r = request_from_pod(p, params.fabric)
        except ObjectError:
            continue
        if r.gang == req.gang and not (p.get("spec") or {}).get("nodeName"):
            members.append(r)
    members.sort(key=lambda r: (r.key != req.key, r.key))
    get_policy(DEFAULT_GANG_POLICY)
    name = (
        params.placement_policy if params.placement_policy in GANG_POLICIES else DEFAULT_GANG_POLICY
    )
    try:
        greq = gang_request(
            members,
            gang_size(req, snap, members),
            declared_topology=group_topology(req, snap, params.fabric),
        )
    except GangSizeError as exc:
        return {"pod": req.key, "verb": "offline", "gang": req.gang, "summary": exc.reason}
    result = get_policy(name)(snap, greq, params)
    details = dict(result.details)
    if not result.ok:
        need = sum(m.gpus for m in members)
        a = snap.arrays
        free = int(a.free[a.blocked == 0].sum()) if len(snap.nodes) else 0
        info = {
            "reason": result.reason,
            "members": greq.size,
            "free_gpus": free,
            "gpus_requested_by_members_seen": need,
            "details": details,
        }
        return {
            "pod": req.key,
            "verb": "refusal",
            "gang": req.gang,
            **info,
            "summary": info_summary("refusal", req.gang, info),
        }
    slots = [
        {"slot": a.pod, "node": a.node, "gpus": list(a.gpus), "member": a.pod}
        for a in result.assignments
    ]
    info = {"gang": req.gang, "plan": "", "policy": name, "slots": slots, "details": details}
    mine = next((s for s in slots if s["member"] == req.key), None)
    return {
        "pod": req.key,
        "verb": "plan",
        **info,
        "planned_node": mine["node"] if mine else None,
        "summary": info_summary("plan", req.gang, info),
    }


# ---- text ---------------------------------------------------------------------------------


def _points(p: Mapping[str, Any], comp: Mapping[str, Any], w: Mapping[str, Any]) -> str:
    bits = [f"{k} {p[k]:.2f} ({comp[k]:.2f} x weight {w[k]:g})" for k in PARTS]
    text = " + ".join(bits)
    if p.get("rounding"):
        text += f" {'-' if p['rounding'] < 0 else '+'} rounding {abs(p['rounding']):.2f}"
    if p.get("choice"):
        text += f" + engine's choice {p['choice']}"
    return text


def occupancy_line(node: str, occ: Mapping[str, Any]) -> str:
    """``node: 6/8 GPUs in use before, 7/8 after (1 unhealthy)``."""
    if not occ:
        return ""
    cap = occ["capacity"]
    bad = f", {len(occ['unhealthy'])} unhealthy" if occ.get("unhealthy") else ""
    if occ.get("reserved_before"):
        bad += f", {len(occ['reserved_before'])} reserved for a gang slot before"
    return (
        f"{node}: {len(occ['used_before'])}/{cap} GPUs in use before, "
        f"{len(occ['used_after'])}/{cap} after{bad}"
    )


def _reasons(d: Mapping[str, int], examples: Mapping[str, Any] | None = None) -> str:
    ex = examples or {}

    def one(r: str, n: int) -> str:
        names = ex.get(r) or []
        more = ", ..." if n > len(names) else ""
        return f"{n}x {r}" + (f" ({', '.join(names)}{more})" if names else "")

    return "; ".join(one(r, n) for r, n in d.items())


def render_single(exp: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """A single pod's explanation (see :func:`scheduler.core.explain.explain`) as text."""
    lines = []
    req = exp.get("request") or {}
    ask = f"{req.get('gpus')} GPU(s)"
    if req.get("min_link"):
        ask += f", every link {req['min_link']} or better"
    if req.get("node_selector"):
        ask += ", nodeSelector " + ",".join(f"{k}={v}" for k, v in req["node_selector"].items())
    lines.append(
        f"{exp['pod']} asks {ask} [{exp.get('verb')}; {exp.get('feasible')} of "
        f"{exp.get('candidates')} candidate nodes can take it]"
    )
    c = exp.get("chosen")
    if c:
        how = "the engine's choice" if c.get("engine_choice") else "not the engine's choice"
        gpus = ",".join(map(str, c.get("gpus_chosen") or []))
        lines.append(f"{indent}placed on {c['node']} GPUs {gpus} ({how})")
        lines.append(
            f"{indent}score {c['score']} = {_points(c['points'], c['components'], exp['weights'])}"
        )
        lines.append(f"{indent}occupancy {occupancy_line(c['node'], c.get('occupancy') or {})}")
        ties = exp.get("ties") or {}
        if ties.get("count", 0) > 1:
            shown = ", ".join(ties.get("tied") or [])
            lines.append(
                f"{indent}{ties['count']} nodes tied at rank {c['rank']:.4f} ({shown}"
                f"{', ...' if ties['count'] > len(ties.get('tied') or []) else ''}); "
                f"tie broken by {ties['broken_by']}"
            )
        for i, r in enumerate(exp.get("runners_up") or []):
            pts = " ".join(f"{k} {r['points'][k]:.2f}" for k in PARTS)
            head = "runner-up" if i == 0 else "next"
            lines.append(f"{indent}{head}: {r['node']} score {r['score']} ({pts}): {r['why_lost']}")
    else:
        lines.append(f"{indent}pending: no candidate node can take it")
        close = exp.get("closest")
        if close:
            lines.append(
                f"{indent}closest: {close['node']} ({close['verdict']}) lacks {close['lacks']}"
            )
    if exp.get("failed"):
        lines.append(
            f"{indent}not now (FailedNodes): {_reasons(exp['failed'], exp.get('examples'))}"
        )
    if exp.get("unresolvable"):
        lines.append(
            f"{indent}never (Unresolvable): {_reasons(exp['unresolvable'], exp.get('examples'))}"
        )
    return lines


def render_share(d: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """A fractional pod's record as text: the policy's choice and the runners-up."""
    lines = [f"{d.get('pod')} [{d.get('verb')}] {d.get('summary', '')}"]
    for r in ([d["chosen"]] if d.get("chosen") else []) + list(d.get("runners_up") or []):
        shares = ", ".join(f"GPU {g}: {m} MiB, {k // 10} % SMs" for g, m, k in r["shares"])
        lost = f" ({r['why_lost']})" if r.get("why_lost") else " (chosen)"
        lines.append(
            f"{indent}{r['node']}: score {r['score']}/10, policy {r['policy_score']}/100; "
            f"{shares}{lost}"
        )
    if d.get("reasons"):
        lines.append(f"{indent}cannot take it: {_reasons(d['reasons'])}")
    return lines


def render(found: Mapping[str, Any]) -> list[str]:
    """Every record of an explain answer as text, newest first."""
    decisions = found.get("decisions") or []
    if not decisions:
        why = found.get("error") or (
            "no decision held for it (never seen by this extender, or evicted from the "
            "ring; a bound pod's placement record carries the summary under 'why')"
        )
        return [f"{found.get('pod')}: {why}", *rightsize_lines(found)]
    lines: list[str] = []
    for d in decisions:
        if d.get("kind") == "share":
            lines += render_share(d)
        elif "chosen" in d:
            lines += render_single(d)
        else:
            lines.append(f"{d.get('pod')} [{d.get('verb')}] {d.get('summary', '')}")
    return lines + rightsize_lines(found)


__all__ = ["add_parser", "explain_offline", "occupancy_line", "render", "render_single", "run"]

"""``topoplace demo``: a scripted kube-scheduler conversation over real HTTP, and why.

Starts the extender in-process (uvicorn on a free loopback port) on the embedded demo
cluster, then plays kube-scheduler: for each pending pod it POSTs ``filter`` with every
node name (``nodeCacheCapable: true``), ``prioritize`` when at least two nodes are
feasible, picks the best score (ties by name; kube-scheduler would pick at random) and
POSTs ``bind``. Then it asks the extender why (``GET /v1/inspect/decisions``) and tells
the story of each step from that record: the winner and its score taken apart, the
runner-up and why it lost, ties, the node's GPUs before and after, what the other nodes
lacked. Every caption is computed from the decision; nothing about the outcome is
written in advance except what each step expects (placed or pending), and the demo exits
1 when a step does not behave. ``--ui`` then keeps serving the cluster view
(``/ui``) on the result and opens it in a browser.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
import webbrowser
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import orjson

from benchmarks.clusters import make_pod


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """uvicorn serving an ASGI app on 127.0.0.1 in a background thread (context manager)."""

    def __init__(
        self, app: Any, port: int | None = None, host: str = "127.0.0.1", http: Any = None
    ) -> None:
        import uvicorn

        self.host = host
        self.port = port or free_port()
        from scheduler.server.guard import UVICORN_LEAN, GuardState, uvicorn_guard_kwargs

        # The protocol `serve` runs (the connection guard and the verbs' fast lane) unless
        # ``http`` names another protocol class.
        http = (
            {"http": http}
            if http is not None
            else uvicorn_guard_kwargs(GuardState(), getattr(app, "verbs", None))
        )
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=self.port,
                log_level="warning",
                lifespan="off",
                **UVICORN_LEAN,
                **http,
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("extender did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


GB200 = {"nvidia.com/gpu.product": "NVIDIA-GB200"}


@dataclass(frozen=True)
class Step:
    """One scripted pod (or gang) and what the step expects: "placed" or "pending"."""

    title: str
    pods: tuple[dict[str, Any], ...]
    expect: str = "placed"
    notes: tuple[str, ...] = field(default_factory=tuple)


def _step(title: str, pod: dict[str, Any], expect: str = "placed") -> Step:
    return Step(title, (pod,), expect)


def scripted_steps() -> list[Step]:
    """The demo's steps. Titles say what is asked, never where it should land."""
    nvlink = {"topoplace.io/min-link": "nvlink"}
    return [
        _step("one GPU", make_pod("notebook-1", 1, namespace="research")),
        _step("one more GPU", make_pod("notebook-2", 1, namespace="research")),
        _step("4 GPUs", make_pod("llama-ft-1", 4, namespace="ml-train")),
        _step("2 GPUs", make_pod("embed-1", 2, namespace="ml-serve")),
        _step(
            "8 GPUs, every link NVLink",
            make_pod("gpt-pretrain-0", 8, namespace="ml-train", annotations=nvlink),
        ),
        _step(
            "4 GB200 GPUs over NVLink",
            make_pod(
                "moe-infer-0",
                4,
                namespace="ml-serve",
                annotations=nvlink,
                node_selector=GB200,
            ),
        ),
        Step(
            "a gang of 3 x 4 GB200 GPUs, all or nothing, in one NVLink domain",
            tuple(
                make_pod(
                    f"llama-pt-{i}",
                    4,
                    namespace="ml-train",
                    gang="llama-pt",
                    gang_size=3,
                    node_selector=GB200,
                    annotations={"topoplace.io/topology-required": "nvlink-domain"},
                )
                for i in range(3)
            ),
        ),
        _step("16 GPUs in one pod", make_pod("too-big-0", 16, namespace="ml-train"), "pending"),
        _step("a HAMi share: 6000 MiB, 30 % of the SMs", share_pod("chat-7b-0", 6000, 30)),
        _step("the same share again", share_pod("chat-7b-1", 6000, 30)),
        _step("a HAMi share: 9360 MiB, 40 % of the SMs", share_pod("rerank-0", 9360, 40)),
        _step("a HAMi share: 50 % of a GPU's memory", share_pod("asr-0", 0, 20, percent=50)),
    ]


def share_pod(name: str, mem: int, cores: int, percent: int = 0) -> dict[str, Any]:
    """A fractional pod as HAMi users write it (``nvidia.com/gpumem`` MiB or
    ``gpumem-percentage``, ``nvidia.com/gpucores`` %)."""
    pod = make_pod(name, 1, namespace="ml-serve", cpu="4", memory="16Gi")
    res = pod["spec"]["containers"][0]["resources"]
    share = {"nvidia.com/gpucores": str(cores)}
    if percent:
        share["nvidia.com/gpumem-percentage"] = str(percent)
    else:
        share["nvidia.com/gpumem"] = str(mem)
    res["limits"].update(share)
    return pod


def scripted_pods() -> list[tuple[str, dict[str, Any]]]:
    """Every scripted pod with its step's title, in order."""
    return [(s.title, p) for s in scripted_steps() for p in s.pods]


def _schedule(client: httpx.Client, names: list[str], pod: dict[str, Any]) -> dict[str, Any]:
    args = {"Pod": pod, "Nodes": None, "NodeNames": names}
    f = _ok(client.post("/scheduler/filter", content=orjson.dumps(args)))
    feasible = f["NodeNames"] or []
    row: dict[str, Any] = {
        "feasible": len(feasible),
        "failed": dict(f["FailedNodes"] or {}),
        "unresolvable": dict(f["FailedAndUnresolvableNodes"] or {}),
        "error": f["Error"],
        "node": "",
        "gpus": [],
        "score": None,
    }
    if f["Error"] or not feasible:
        return row
    if len(feasible) >= 2:
        scores = _ok(
            client.post(
                "/scheduler/prioritize", content=orjson.dumps({**args, "NodeNames": feasible})
            )
        )
        best = min(scores, key=lambda s: (-s["Score"], s["Host"]))
        row["node"], row["score"] = best["Host"], best["Score"]
    else:
        row["node"] = feasible[0]
    m = pod["metadata"]
    b = _ok(
        client.post(
            "/scheduler/bind",
            content=orjson.dumps(
                {
                    "PodName": m["name"],
                    "PodNamespace": m["namespace"],
                    "PodUID": m["uid"],
                    "Node": row["node"],
                }
            ),
        )
    )
    row["error"] = b["Error"]
    placements = _ok(client.get("/v1/inspect/placements"))["placements"]
    key = f"{m['namespace']}/{m['name']}"
    held = next((p for p in placements if p["pod"] == key), {})
    row["gpus"] = held.get("gpus") or [s[0] for s in held.get("shares") or []]
    row["shares"] = held.get("shares") or []
    return row


def _ok(r: httpx.Response) -> Any:
    """The JSON of a 200 answer; anything else fails the step."""
    if r.status_code != 200:
        raise StepFailed(f"{r.request.method} {r.request.url.path}: HTTP {r.status_code}")
    return r.json()


class StepFailed(Exception):
    """A step did not behave (an HTTP error, a bind error, an unexpected outcome)."""


def _reasons(row: Mapping[str, Any]) -> str:
    c = Counter(row["failed"].values())
    c.update(row["unresolvable"].values())
    return "; ".join(f"{n}x {r}" for r, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


# ---- captions: computed from the decision record ------------------------------------------


def _single_caption(exp: Mapping[str, Any]) -> str:
    """Why the pod went where it went (or stayed pending), from its explanation."""
    c = exp.get("chosen")
    if not c:
        close = exp.get("closest")
        top = next(iter({**exp.get("failed", {}), **exp.get("unresolvable", {})}), "no node")
        near = f"; the closest, {close['node']}, lacks {close['lacks']}" if close else ""
        return f"fits nowhere: {top}{near}"
    bits = []
    occ = c.get("occupancy") or {}
    used = len(occ.get("used_before") or [])
    if used:
        bits.append(f"packs onto {c['node']} ({used}/{occ['capacity']} GPUs already in use)")
    else:
        bits.append(f"takes an idle node, {c['node']}")
    ru = exp.get("runners_up") or []
    ties = exp.get("ties") or {}
    if ties.get("count", 0) > 1:
        bits.append(f"{ties['count']} nodes tie at the top, {ties['broken_by']} wins")
    elif ru:
        bits.append(f"beats {ru[0]['node']}: it {ru[0]['why_lost']}")
    else:
        bits.append("the only node that can take it")
    skipped = [
        f"{', '.join(exp['examples'].get(r, []))} ({r})"
        for r in exp.get("unresolvable", {})
        if exp.get("examples", {}).get(r)
    ]
    if skipped:
        bits.append("never considered: " + "; ".join(skipped[:3]))
    return "; ".join(bits)


def _gang_caption(plan: Mapping[str, Any] | None) -> str:
    if not plan:
        return "no plan recorded"
    slots = plan.get("slots") or []
    nodes = sorted({s["node"] for s in slots})
    d = plan.get("details") or {}
    used = d.get("domains_used") or {}
    bound = d.get("lower_bound") or {}
    doms = [
        f"{used[k]} {k} (fewest possible {bound.get(k, '?')})"
        for k in ("nvlink-domain", "leaf")
        if k in used
    ]
    text = f"planned whole by {plan.get('policy')}: {len(slots)} members on {', '.join(nodes)}"
    if doms:
        text += "; uses " + ", ".join(doms)
    if d.get("solver_status"):
        text += f"; solver {d['solver_status']}"
    return text


def _story(step: Step, rows: list[dict[str, Any]], records: list[list[dict[str, Any]]]) -> None:
    from scheduler.cli.explain import occupancy_line, render_share, render_single

    for row, recs in zip(rows, records, strict=True):
        single = next((r for r in recs if "chosen" in r), None)
        if single is not None and single.get("kind") == "share":
            for line in render_share(single, indent="     "):
                print(f"   {line}")
            if row.get("occupancy"):
                print(f"     occupancy {occupancy_line(row['node'], row['occupancy'])}")
        elif single is not None:
            for line in render_single(single, indent="     "):
                print(f"   {line}")
        else:
            node = row["node"] or "UNSCHEDULABLE"
            print(f"   {row['pod']} -> {node} GPUs {','.join(map(str, row['gpus'])) or '-'}")
            if row.get("occupancy"):
                print(f"     occupancy {occupancy_line(row['node'], row['occupancy'])}")
    print(f"   why: {rows[0]['caption']}")


def _gpu_states(client: httpx.Client) -> dict[str, list[int]]:
    """Node -> per-GPU state codes of the cluster view (``scheduler.server.ui``)."""
    view = _ok(client.get("/v1/inspect/view"))
    return {n["name"]: n["gpus"] for n in view["nodes"]}


def _occupancy(node: str, gpus: list[int], before: Mapping[str, list[int]]) -> dict[str, Any]:
    """GPU use of ``node`` before the pod (from the view taken before its filter) and after."""
    from scheduler.server.ui import GPU_BAD, GPU_FREE, GPU_RESERVED

    states = before.get(node)
    if states is None:
        return {}
    used = [i for i, s in enumerate(states) if s not in (GPU_FREE, GPU_BAD, GPU_RESERVED)]
    return {
        "capacity": len(states),
        "used_before": used,
        "used_after": sorted(set(used) | set(gpus)),
        "reserved_before": [i for i, s in enumerate(states) if s == GPU_RESERVED],
        "unhealthy": [i for i, s in enumerate(states) if s == GPU_BAD],
    }


QUIET_LOGGERS = ("topoplace", "scheduler")
"""The extender's loggers (the bind audit line is ``topoplace.bind``): held at WARNING while
the demo tells its story, unless ``--verbose``."""


@contextlib.contextmanager
def _quiet_logs(quiet: bool) -> Iterator[None]:
    """While in the block, with ``quiet``, the extender's loggers pass only warnings and
    errors (the story is all the demo prints); their levels are restored after."""
    loggers = [logging.getLogger(n) for n in QUIET_LOGGERS] if quiet else []
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)


def run_demo(
    cluster: str | None = None,
    as_json: bool = False,
    ui: bool = False,
    port: int | None = None,
    open_browser: bool = True,
    verbose: bool = False,
) -> int:
    """Run the demo; returns 0 when every scripted step behaved, 1 otherwise. Prints the
    story of each step and nothing else: the in-process extender logs (to stderr, as
    ``--log-level`` says) only with ``verbose``, else only its warnings and errors."""
    with _quiet_logs(not verbose):
        return _play(cluster, as_json, ui, port, open_browser)


def _play(
    cluster: str | None, as_json: bool, ui: bool, port: int | None, open_browser: bool
) -> int:
    """:func:`run_demo`'s body."""
    from scheduler.cli.clusterfile import build_file_extender, load_params
    from scheduler.server.app import create_app

    logging.getLogger("httpx").setLevel(logging.WARNING)
    params = load_params(None)
    # The demo shows every node's verdict, also beside the node a pod gets.
    params = replace(params, extender=replace(params.extender, reasons_when_placed=True))
    extender, what = build_file_extender(cluster, params)
    app = create_app(extender, description=what)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    with ServerThread(app, port) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        nodes = _ok(client.get("/v1/inspect/nodes"))
        names = [n["name"] for n in nodes["nodes"]]
        if not as_json:
            print(
                f"topoplace demo on the {what}: {len(names)} nodes, "
                f"{nodes['assumed_topology_nodes']} with unknown interconnect (treated as "
                f"all-SYS); score weights {_weights(params)}\n"
            )
        for n, step in enumerate(scripted_steps(), 1):
            step_rows, records = [], []
            try:
                for pod in step.pods:
                    before = _gpu_states(client)
                    row = _schedule(client, names, pod)
                    m = pod["metadata"]
                    key = f"{m['namespace']}/{m['name']}"
                    recs = _ok(client.get("/v1/inspect/decisions", params={"pod": key}))
                    row.update(
                        pod=key,
                        what=step.title,
                        request=int(
                            pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
                        ),
                        occupancy=_occupancy(row["node"], row["gpus"], before)
                        if row["node"]
                        else {},
                    )
                    step_rows.append(row)
                    records.append(recs["decisions"])
            except (StepFailed, httpx.HTTPError) as exc:
                failures.append(f"step {n} ({step.title}): {exc}")
                if not as_json:
                    print(f"{n}. {step.title}: FAILED: {exc}")
                continue
            caption = _caption(step, step_rows, records, params.sharing.policy)
            for r in step_rows:
                r["caption"] = caption
                single = next((x for x in records[step_rows.index(r)] if "chosen" in x), None)
                r["explanation"] = single
            outcome = (
                "placed"
                if all(r["node"] and not r["error"] for r in step_rows)
                else ("pending" if not any(r["node"] for r in step_rows) else "partly placed")
            )
            for r in step_rows:
                r["expected"], r["ok"] = step.expect, outcome == step.expect
            rows += step_rows
            if outcome != step.expect:
                errs = "; ".join(r["error"] for r in step_rows if r["error"])
                failures.append(
                    f"step {n} ({step.title}): expected {step.expect}, got {outcome}"
                    + (f" ({errs})" if errs else "")
                )
            if not as_json:
                mark = "" if outcome == step.expect else f"  FAILED: expected {step.expect}"
                print(f"{n}. {step.title}: {outcome}{mark}")
                _story(step, step_rows, records)
                print()
        if as_json:
            print(
                orjson.dumps(
                    {"cluster": what, "decisions": rows, "failures": failures, "ok": not failures},
                    option=orjson.OPT_INDENT_2,
                ).decode()
            )
        else:
            _print_ledger(client)
            print(f"{len(rows)} pods in {len(scripted_steps())} steps; ", end="")
            print("every step behaved" if not failures else f"{len(failures)} step(s) FAILED:")
            for f in failures:
                print(f"  {f}")
        if ui:
            url = f"{srv.url}/ui"
            print(f"\ncluster view: {url}  (Ctrl-C to stop)", flush=True)
            if open_browser:
                webbrowser.open(url)
            # Re-arm Ctrl-C: after serving requests, the process-level SIGINT disposition was
            # found at its default (the demo died on Ctrl-C, exit -2, without cleanup).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                while srv.thread.is_alive():
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
    return 1 if failures else 0


def _weights(params: Any) -> str:
    w = params.weights
    return f"topology {w.topology:g}, health {w.health:g}, packing {w.packing:g}"


def _caption(
    step: Step,
    rows: list[dict[str, Any]],
    records: list[list[dict[str, Any]]],
    sharing_policy: str = "",
) -> str:
    """The step's caption, from its decision records (and, for a fractional pod, the
    sharing policy the extender runs with)."""
    gang_plan = next((r for recs in records for r in recs if r.get("verb") == "plan"), None)
    if len(step.pods) > 1 or gang_plan is not None:
        if gang_plan is None:
            refusal = next(
                (r for recs in records for r in recs if r.get("verb") == "refusal"), None
            )
            return refusal["summary"] if refusal else "no gang record"
        return _gang_caption(gang_plan)
    if rows[0].get("shares"):
        return _share_caption(rows[0], sharing_policy)
    single = next((r for r in records[0] if "chosen" in r and r.get("kind") != "share"), None)
    if single is None:
        return f"no decision recorded; rejected: {_reasons(rows[0]) or '-'}"
    return _single_caption(single)


def _share_caption(row: Mapping[str, Any], policy: str = "") -> str:
    """A fractional pod's share, as the extender holds it (GPU, MiB, % of the SMs), and
    the sharing policy that chose it."""
    parts = [
        f"GPU {g} of {row['node']}: {mem} MiB, {milli // 10} % SMs"
        for g, mem, milli in row["shares"]
    ]
    chose = f" (chosen by the sharing policy {policy})" if policy else ""
    return "shares " + "; ".join(parts) + chose


def _print_ledger(client: httpx.Client) -> None:
    """GPU memory left per GPU on the nodes that share GPUs."""
    print("shared GPUs (fractional pods): memory left per GPU")
    for n in _ok(client.get("/v1/inspect/nodes"))["nodes"]:
        if n.get("sharing"):
            left = ", ".join(
                f"GPU{g['gpu']} {g['memory_free_mib']}/{g['memory_mib']} MiB ({g['tasks']} pods)"
                for g in n["gpu_ledger"]
            )
            print(f"  {n['name']:<16} {left}")

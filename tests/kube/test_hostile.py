"""Live: a hostile tenant and a rogue caller against the real control plane (issue 12).

* A pod whose ``topoplace.io/gang-size`` is ``"1e1000000"`` (any tenant can write it; the
  API server does not validate annotations) is created, watched and filtered: it is
  refused with a reason naming the annotation and stays pending, ``/healthz`` answers all
  along, a normal GPU pod created right after it is bound, and the hostile pod costs the
  extender no more than 100 ms of CPU time beyond what a normal pod costs (CPU time of the
  topoplace process from ``/proc/<pid>/task/*/schedstat``; CPU, not wall time, so the load
  of the machine does not count; ``/healthz`` wall latencies are printed, not asserted).
* Binds from outside kube-scheduler (anyone who reaches the port with a valid client
  certificate) are refused and bind nothing: a pod of another scheduler, a topoplace pod
  onto a node its filter refuses, a pod that does not exist.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.kube.conftest import Topoplace
from tests.kube.test_live import (
    clean,  # noqa: F401  (autouse: pods deleted after each test)
    gpu_pod,
    wait_for,
)

HOSTILE = "1e1000000"
EXTRA_CPU_NS = 100_000_000


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def _probe(
    tp: Topoplace,
    stop: threading.Event,
    lat: list[float],
    bad: list[Any],
    first: threading.Event,
) -> None:
    """GET /healthz every 20 ms until ``stop``: wall latencies into ``lat``, anything but a
    200 (a status, or the exception that ended the probe) into ``bad``; ``first`` is set
    once the first probe is done (the test starts its work only then: on a loaded host the
    client's set-up alone can outlast the work, and nothing would be probed)."""
    try:
        with httpx.Client(**tp._client_kw()) as c:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    status = c.get(tp.url + "/healthz", timeout=10).status_code
                except httpx.HTTPError:
                    status = 0
                lat.append(time.perf_counter() - t)
                if status != 200:
                    bad.append(status)
                first.set()
                time.sleep(0.02)
    except Exception as exc:  # reported by the test, not lost in the thread
        bad.append(repr(exc))
    finally:
        first.set()


def _bound_within(core: Any, ns: str, name: str, timeout: float) -> str:
    return str(wait_for(lambda: core.read_namespaced_pod(name, ns).spec.node_name, timeout, name))


def _window(core: Any, tp: Topoplace, ns: str, pods: list[dict[str, Any]], bound: str) -> int:
    """Create ``pods``, wait until ``bound`` is bound; the topoplace CPU ns it took."""
    assert tp.proc is not None
    before = cpu_ns(tp.proc.pid)
    for p in pods:
        core.create_namespaced_pod(ns, p)
    _bound_within(core, ns, bound, 60)
    return cpu_ns(tp.proc.pid) - before


def test_hostile_gang_size_is_refused_and_costs_nothing_noticeable(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    stop = threading.Event()
    lat: list[float] = []
    bad: list[Any] = []
    first = threading.Event()
    prober = threading.Thread(target=_probe, args=(topoplace, stop, lat, bad, first))
    prober.start()
    assert first.wait(60), "the /healthz probe did not answer within 60 s"
    try:
        control = _window(
            core, topoplace, namespace, [gpu_pod("calm-0", 1, scheduler_name, run_id)], "calm-0"
        )
        hostile = gpu_pod(
            "hostile",
            1,
            scheduler_name,
            run_id,
            annotations={"topoplace.io/gang": "evil", "topoplace.io/gang-size": HOSTILE},
        )
        other = gpu_pod(
            "hostile-other", 1, "nobody", run_id, annotations={"topoplace.io/gang-size": HOSTILE}
        )
        spent = _window(
            core,
            topoplace,
            namespace,
            [hostile, other, gpu_pod("calm-1", 1, scheduler_name, run_id)],
            "calm-1",
        )

        # The hostile pod is refused with a reason naming the annotation, and stays pending.
        def refused() -> str:
            evs = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=hostile"
            ).items
            return " ".join(e.message or "" for e in evs if e.reason == "FailedScheduling")

        message = wait_for(refused, 60, "FailedScheduling event of the hostile pod")
        assert "gang-size" in message, message
        assert not core.read_namespaced_pod("hostile", namespace).spec.node_name
        assert not core.read_namespaced_pod("hostile-other", namespace).spec.node_name
    finally:
        stop.set()
        prober.join()
    assert not bad, f"/healthz failed {len(bad)} time(s): {bad[:5]}"
    assert lat, "no /healthz probe completed"
    lat.sort()
    print(
        f"\n/healthz during the hostile pod: n={len(lat)}, p50 {lat[len(lat) // 2] * 1000:.1f} "
        f"ms, max {lat[-1] * 1000:.1f} ms; topoplace CPU: control {control / 1e6:.1f} ms, "
        f"with the hostile pods {spent / 1e6:.1f} ms"
    )
    assert spent - control <= EXTRA_CPU_NS, (spent, control)


def test_rogue_binds_from_outside_are_refused(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    foreign = gpu_pod("foreign", 1, "nobody", run_id)
    core.create_namespaced_pod(namespace, foreign)
    mine = gpu_pod("mine", 1, scheduler_name, run_id, gated=True)
    mine["spec"]["nodeSelector"]["kubernetes.io/hostname"] = gpu_nodes[0]
    core.create_namespaced_pod(namespace, mine)
    kw = topoplace._client_kw()

    def bind(name: str, node: str) -> str:
        pod = core.read_namespaced_pod(name, namespace) if name != "ghost" else None
        body = {
            "PodName": name,
            "PodNamespace": namespace,
            "PodUID": pod.metadata.uid if pod is not None else "",
            "Node": node,
        }
        r = httpx.post(topoplace.url + "/scheduler/bind", json=body, timeout=10, **kw)
        assert r.status_code == 200
        return str(r.json()["Error"])

    assert "schedulerName" in bind("foreign", gpu_nodes[0])
    # Its nodeSelector pins it to gpu_nodes[0]: topoplace's own filter refuses gpu_nodes[1].
    assert bind("mine", gpu_nodes[1]) != ""
    assert bind("ghost", gpu_nodes[0]) != ""
    for name in ("foreign", "mine"):
        assert not core.read_namespaced_pod(name, namespace).spec.node_name, name

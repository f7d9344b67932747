"""Smoke tests of the live benchmark (``benchmarks/live``) that need no cluster: the shipped
scheduler configuration as rendered for a loopback run, the offline replay, the figures, the
openb scenario, and the report.

The live run itself is opt-in: ``TOPOPLACE_LIVE_BENCH=1`` with ``KUBE_BIN`` holding the
control-plane binaries runs a tiny benchmark on ports 17443/24790/24800/11259/11260/8890
(override with ``TOPOPLACE_LIVE_BENCH_PORTS=api,etcd,etcd-peer,topoplace-sched,default-sched,extender``).
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import pytest
import yaml

from benchmarks.live import kubesched
from benchmarks.live.metrics import (
    Figures,
    apiserver_calls,
    compare_with_offline,
    histogram_ms,
    histogram_quantile,
    metric_deltas,
    parse_prometheus,
    percentile,
    placement_figures,
    timing_figures,
)
from benchmarks.live.offline import replay
from benchmarks.live.run import paired_ratios, profile_top, render_summary
from benchmarks.live.scenario import (
    GANG_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    HOLD_GATE,
    LEAF_LABEL,
    SPINE_LABEL,
    mix_scenario,
    openb_scenario,
)
from scheduler.cli.main import load_params

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
OPENB = SHARED / "data" / "alibaba-gpu-v2023"
KC = "/tmp/livebench-test/kubeconfig"
URL = "http://127.0.0.1:8890/scheduler"


# ---- the shipped scheduler configuration -------------------------------------------------


def test_render_changes_only_what_a_loopback_run_needs() -> None:
    shipped = kubesched.load_shipped()
    assert shipped["kind"] == "KubeSchedulerConfiguration"
    tls = kubesched.extender_uses_tls(shipped)
    tls_dir = "/tmp/livebench-test/tls" if tls else None
    got = yaml.safe_load(kubesched.render_shipped_config(KC, URL, tls_dir=tls_dir))
    assert got["clientConnection"]["kubeconfig"] == KC
    assert got["leaderElection"]["leaderElect"] is False
    assert len(got["extenders"]) == 1
    want_url = URL.replace("http://", "https://") if tls else URL
    assert got["extenders"][0]["urlPrefix"] == want_url
    # Everything else exactly as shipped (read from the real file now: it changes).
    want = copy.deepcopy(shipped)
    want.setdefault("clientConnection", {})["kubeconfig"] = KC
    want.setdefault("leaderElection", {})["leaderElect"] = False
    want["extenders"][0]["urlPrefix"] = want_url
    if tls:  # the run's own certificates in place of the mounted Secret's
        want["extenders"][0]["tlsConfig"].update(
            caFile=f"{tls_dir}/ca.crt",
            certFile=f"{tls_dir}/client.crt",
            keyFile=f"{tls_dir}/client.key",
        )
    assert got == want
    # qps/burst only if shipped.
    for key in ("qps", "burst"):
        assert (key in got["clientConnection"]) == (key in (shipped.get("clientConnection") or {}))
    # What the deploy docs promise about the extender (values of the shipped file).
    ext = got["extenders"][0]
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["bindVerb"] == "bind" and ext["filterVerb"] == "filter"
    assert {r["name"] for r in ext["managedResources"]} == {
        "nvidia.com/gpu",
        # fractional GPUs (docs/fractional.md): HAMi's and gpushare's share resources
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "aliyun.com/gpu-mem",
        "nvidia.com/gpu.shared",  # time-slicing / MPS replicas under a renamed resource
    }
    assert got["percentageOfNodesToScore"] == 100
    assert kubesched.profile_names(got) == ["topoplace"]


def test_transport_configs_are_plain_as_shipped_and_mtls_from_the_component(
    tmp_path: Path,
) -> None:
    """config/deploy ships plain HTTP on loopback; the mTLS component's configuration renders
    https with the run's own certificates, and cannot render without them."""
    plain = kubesched.load_shipped(kubesched.TRANSPORT_CONFIGS["plain"])
    mtls = kubesched.load_shipped(kubesched.TRANSPORT_CONFIGS["mtls"])
    assert kubesched.load_shipped() == plain
    assert (kubesched.extender_transport(plain), kubesched.extender_transport(mtls)) == (
        "plain",
        "mtls",
    )
    got = yaml.safe_load(
        kubesched.render_shipped_config(
            KC, URL, path=kubesched.TRANSPORT_CONFIGS["mtls"], tls_dir=tmp_path
        )
    )
    (ext,) = got["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:8890/scheduler"
    assert ext["tlsConfig"] == {
        "caFile": f"{tmp_path}/ca.crt",
        "certFile": f"{tmp_path}/client.crt",
        "keyFile": f"{tmp_path}/client.key",
    }
    with pytest.raises(kubesched.ConfigError, match="tls_dir"):
        kubesched.render_shipped_config(KC, URL, path=kubesched.TRANSPORT_CONFIGS["mtls"])
    server_only = copy.deepcopy(mtls)
    del server_only["extenders"][0]["tlsConfig"]["certFile"]
    assert kubesched.extender_transport(server_only) == "tls"


def test_runner_picks_the_transport_and_reports_it(tmp_path: Path) -> None:
    from benchmarks.live.run import parse_args, transport_line

    base = ["--out", str(tmp_path / "o"), "--nodes", "8", "--big", "1", "--small", "3"]
    assert Path(parse_args(base).shipped_config) == kubesched.SHIPPED_CONFIG
    assert Path(parse_args([*base, "--transport", "mtls"]).shipped_config) == (
        kubesched.MTLS_CONFIG
    )
    mtls_file = str(kubesched.MTLS_CONFIG)
    assert parse_args([*base, "--shipped-config", mtls_file]).shipped_config == mtls_file
    with pytest.raises(SystemExit):  # the file says mtls
        parse_args([*base, "--transport", "plain", "--shipped-config", mtls_file])
    assert transport_line("plain", kubesched.SHIPPED_CONFIG).startswith(
        "plain HTTP on loopback as shipped (config/deploy/scheduler-config.yaml: http://127.0.0.1"
    )
    assert transport_line("mtls", kubesched.MTLS_CONFIG).startswith(
        "mTLS (config/deploy/mtls/scheduler-config-mtls.yaml: https urlPrefix"
    )


def test_render_points_a_tls_extender_at_the_runs_certificates(tmp_path: Path) -> None:
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "topoplace"}],
        "extenders": [
            {
                "urlPrefix": "https://127.0.0.1:8888/scheduler",
                "enableHTTPS": True,
                "tlsConfig": {"caFile": "/etc/x/ca.crt", "certFile": "/etc/x/c", "keyFile": "/k"},
            }
        ],
    }
    assert kubesched.extender_uses_tls(cfg)
    with pytest.raises(kubesched.ConfigError):
        kubesched.render_config(cfg, KC, URL)
    got = kubesched.render_config(cfg, KC, URL, tls_dir=tmp_path)
    ext = got["extenders"][0]
    assert ext["urlPrefix"] == "https://127.0.0.1:8890/scheduler"
    assert ext["tlsConfig"] == {
        "caFile": str(tmp_path / "ca.crt"),
        "certFile": str(tmp_path / "client.crt"),
        "keyFile": str(tmp_path / "client.key"),
    }
    assert cfg["extenders"][0]["tlsConfig"]["caFile"] == "/etc/x/ca.crt"  # not mutated
    plain = {**cfg, "extenders": [{"urlPrefix": "http://127.0.0.1:8888/scheduler"}]}
    assert not kubesched.extender_uses_tls(plain)


def test_render_renames_the_profile_and_keeps_unknown_keys(tmp_path: Path) -> None:
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": True, "resourceName": "x"},
        "profiles": [{"schedulerName": "topoplace", "plugins": {"score": {"disabled": []}}}],
        "extenders": [
            {"urlPrefix": "https://example.org/other", "weight": 1},
            {"urlPrefix": "http://127.0.0.1:8888/scheduler", "weight": 7},
        ],
    }
    f = tmp_path / "cm.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "x"},
                "data": {"scheduler-config.yaml": yaml.safe_dump(cfg)},
            }
        )
    )
    got = yaml.safe_load(kubesched.render_shipped_config(KC, URL, "tp2", path=f))
    assert got["clientConnection"] == {"qps": 200, "burst": 400, "kubeconfig": KC}
    assert got["leaderElection"] == {"leaderElect": False, "resourceName": "x"}
    assert got["extenders"][0]["urlPrefix"] == "https://example.org/other"
    assert got["extenders"][1] == {"urlPrefix": URL, "weight": 7}
    assert got["profiles"] == [{"schedulerName": "tp2", "plugins": {"score": {"disabled": []}}}]


def test_render_refuses_a_config_without_extender(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
    with pytest.raises(kubesched.ConfigError):
        kubesched.render_shipped_config(KC, URL, path=f)


def test_default_arm_config_is_plain_with_the_shipped_client_limits() -> None:
    shipped = kubesched.load_shipped()
    cfg = kubesched.render_default_config(KC, "bench-default-100")
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["profiles"] == [{"schedulerName": "bench-default-100"}]  # default plugins
    assert "extenders" not in cfg
    assert cfg["percentageOfNodesToScore"] == 100
    assert cfg["leaderElection"] == {"leaderElect": False}
    conn = cfg["clientConnection"]
    assert conn["kubeconfig"] == KC
    # the same API client limits as topoplace's shipped configuration
    assert (conn["qps"], conn["burst"]) == (
        shipped["clientConnection"]["qps"],
        shipped["clientConnection"]["burst"],
    )
    adaptive = kubesched.render_default_config(KC, "x", percentage_of_nodes_to_score=None)
    assert "percentageOfNodesToScore" not in adaptive


def test_cpu_seconds_of_this_process() -> None:
    t0 = kubesched.cpu_seconds(os.getpid())
    sum(i * i for i in range(200_000))
    assert kubesched.cpu_seconds(os.getpid()) >= t0 > 0
    assert kubesched.cpu_seconds(None) != kubesched.cpu_seconds(None)  # NaN
    busy, total = kubesched.host_cpu_busy()
    assert 0 <= busy <= total


def test_pin_confines_every_thread_of_a_process() -> None:
    import subprocess
    import sys

    usable = sorted(os.sched_getaffinity(0))
    one = frozenset(usable[-1:])
    # A child with a second thread, started before the pin: both must end up confined.
    code = "import threading,time; threading.Thread(target=time.sleep,args=(30,)).start(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            if len(os.listdir(f"/proc/{child.pid}/task")) >= 2:
                break
            time.sleep(0.02)
        assert kubesched.pin(child.pid, one) == len(os.listdir(f"/proc/{child.pid}/task")) >= 2
        for tid in os.listdir(f"/proc/{child.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == one
        assert kubesched.pin(child.pid, None) == 0  # None: left alone
    finally:
        child.kill()
        child.wait()
    assert kubesched.pin(child.pid, one) == 0  # gone: nothing to pin, no error


def test_pin_cpus_argument_needs_two_disjoint_sets_of_this_host() -> None:
    from benchmarks.live import run

    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs two CPUs")
    a, b = usable[0], usable[1]
    args = run.parse_args(["--out", "x", "--pin-cpus", f"{a}/{b}"])
    assert args.pin_cpus == (frozenset({a}), frozenset({b}))
    assert run._cpu_list("0,2-4") == frozenset({0, 2, 3, 4})
    assert run.parse_args(["--out", "x"]).pin_cpus is None
    for bad in (f"{a}", f"{a}/{a}", f"{a}/", "x/y", f"{a}/{max(usable) + 1}"):
        with pytest.raises(SystemExit):
            run.parse_args(["--out", "x", "--pin-cpus", bad])


# ---- scenarios and the offline replay ------------------------------------------------------


def _objects(sc):  # type: ignore[no-untyped-def]
    nodes = [n.to_object("t") for n in sc.nodes]
    pods = [p.to_object("livebench", "topoplace", "t") for p in sc.pods]
    return nodes, pods


def test_mix_scenario_shape() -> None:
    sc = mix_scenario(500, 100, 2000)
    assert len(sc.nodes) == 500 and sc.gpu_capacity == 4000
    h100 = [n for n in sc.nodes if "H100" in n.labels["nvidia.com/gpu.product"]]
    assert len(h100) == 400 and all(
        LEAF_LABEL in n.labels and SPINE_LABEL in n.labels for n in h100
    )
    assert [p.gpus for p in sc.pods[:100]] == [8] * 100
    assert [p.gpus for p in sc.pods[100:]] == [1] * 2000
    assert (sc.best_nodes_used(), sc.best_whole_free()) == (350, 150)
    g = mix_scenario(50, 10, 200, gangs=2, gang_size=4, gang_gpus=8)
    assert len(g.gangs()) == 2 and all(len(m) == 4 for m in g.gangs().values())
    pod = next(p for p in g.pods if p.gang).to_object("ns", "topoplace", "t")
    assert pod["metadata"]["annotations"][GANG_ANNOTATION].startswith("gang-")
    assert pod["metadata"]["annotations"][GANG_SIZE_ANNOTATION] == "4"


def test_offline_replay_mix_packs_to_the_best() -> None:
    sc = mix_scenario(50, 10, 200)
    nodes, pods = _objects(sc)
    res = replay(nodes, pods, load_params(None))
    assert len(res.placements) == 210 and not res.refused and res.narrowed == 0
    fig = placement_figures(
        Figures("offline", 0), sc, {k: v[0] for k, v in res.placements.items()}, {}
    )
    assert (fig.nodes_used, fig.whole_nodes_free, fig.frag_free_gpus) == (35, 15, 0)
    assert fig.allocation_ratio == 1.0 and (fig.best_nodes_used, fig.best_whole_free) == (35, 15)
    # no GPU given twice
    seen = set()
    for node, gpus in res.placements.values():
        for g in gpus:
            assert (node, g) not in seen
            seen.add((node, g))


def test_offline_replay_places_gangs_whole() -> None:
    sc = mix_scenario(50, 10, 200, gangs=2, gang_size=4, gang_gpus=8, nodes_per_leaf=8)
    nodes, pods = _objects(sc)
    res = replay(nodes, pods, load_params(None))
    assert set(res.gangs.values()) == {"placed"} and not res.refused
    nodes_of = {k: v[0] for k, v in res.placements.items()}
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    fig = placement_figures(Figures("offline", 0), sc, nodes_of, labels)
    assert (fig.nodes_used, fig.whole_nodes_free) == (43, 7)
    assert fig.gangs == fig.gangs_complete == 2
    for members in sc.gangs().values():
        assert len({nodes_of[m] for m in members}) == 4


def test_offline_replay_honours_cpu_and_affinity_like_kube_scheduler() -> None:
    from benchmarks.live.scenario import NodeSpec, PodSpec, Scenario

    sc = Scenario(
        "t",
        "",
        (
            NodeSpec("a-small-cpu", 8, cpu_milli=2000, labels={"nvidia.com/gpu.product": "X"}),
            NodeSpec("b-big-cpu", 8, labels={"nvidia.com/gpu.product": "Y"}),
        ),
        (
            PodSpec("p0", 1, cpu_milli=1500),  # both fit CPU-wise: place_pod
            PodSpec("p1", 1, cpu_milli=1500),  # a-small-cpu has 500m left: only b
            PodSpec("p2", 1, cpu_milli=100, gpu_models=("Y",)),  # affinity: only b
        ),
    )
    nodes, pods = _objects(sc)
    res = replay(nodes, pods, load_params(None))
    assert res.narrowed == 2
    assert res.placements["p1"][0] == "b-big-cpu" and res.placements["p2"][0] == "b-big-cpu"


# ---- figures --------------------------------------------------------------------------------


def test_figures_from_placements_and_bind_times() -> None:
    sc = mix_scenario(4, 1, 3, gangs=1, gang_size=2, gang_gpus=8, h100_share=1.0, nodes_per_leaf=2)
    names = [p.name for p in sc.pods]
    assert names == [
        "big-0000",
        "small-00000",
        "gang-00-0",
        "gang-00-1",
        "small-00001",
        "small-00002",
    ]
    nodes_of = {
        "big-0000": "h100-0000",
        "small-00000": "h100-0001",
        "small-00001": "h100-0001",
        "gang-00-0": "h100-0002",
        "gang-00-1": "h100-0003",
    }
    labels = {n.name: dict(n.labels) for n in sc.nodes}
    fig = placement_figures(Figures("topoplace", 1), sc, nodes_of, labels)
    assert (fig.pods_bound, fig.gpus_bound, fig.gpus_requested) == (5, 26, 27)
    assert (fig.nodes_used, fig.whole_nodes_free, fig.frag_free_gpus) == (4, 0, 6)
    assert fig.gangs_complete == 1 and fig.gang_leaves_max == 1
    created = {n: float(i) for i, n in enumerate(names)}
    bound = {n: created[n] + 0.5 for n in nodes_of}
    bound["gang-00-1"] = 4.0  # the gang is partly bound from 2.5 to 4.0
    timing_figures(fig, sc, created, bound, 5.0, 10.0)
    assert fig.latency_p50 == 0.5 and fig.seconds == 4.5  # small-00001, created at 4
    assert fig.gang_partial_max_s == pytest.approx(1.5) and fig.gangs_partial_at_end == 0
    del bound["gang-00-1"]
    timing_figures(fig, sc, created, bound, 5.0, 10.0)
    assert fig.gangs_partial_at_end == 1 and fig.gang_partial_max_s == pytest.approx(7.5)
    compare_with_offline(fig, sc, nodes_of, {**nodes_of, "small-00001": "h100-0002"})
    assert (fig.same_node_as_offline, fig.first_divergence) == (5, 4)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_topoplace_metric_deltas() -> None:
    before = parse_prometheus(
        'topoplace_request_seconds_count{verb="filter"} 10\n'
        'topoplace_request_seconds_sum{verb="filter"} 0.1\n'
        'topoplace_binds_total{result="ok"} 3\n'
        'topoplace_http_connections_total{outcome="accepted",port="main"} 2.0\n'
    )
    after = parse_prometheus(
        "# HELP x\n"
        'topoplace_request_seconds_count{verb="filter"} 30\n'
        'topoplace_request_seconds_sum{verb="filter"} 0.5\n'
        'topoplace_binds_total{result="ok"} 23\n'
        'topoplace_http_connections_total{outcome="accepted",port="main"} 9.0\n'
        'topoplace_http_connections_total{outcome="accepted",port="health"} 4.0\n'
    )
    assert metric_deltas(before, after) == {
        "binds_ok": 20.0,
        "connections_accepted": 7.0,
        "filter_calls": 20.0,
        "filter_mean_ms": 20.0,
    }


def test_histogram_quantiles_from_scrapes() -> None:
    before = parse_prometheus(
        'x_bucket{verb="bind",le="0.01"} 1\n'
        'x_bucket{verb="bind",le="0.1"} 1\n'
        'x_bucket{verb="bind",le="+Inf"} 1\n'
        'x_count{verb="bind"} 1\nx_sum{verb="bind"} 0.005\n'
    )
    after = parse_prometheus(
        'x_bucket{verb="bind",le="0.01"} 51\n'
        'x_bucket{verb="bind",le="0.1"} 101\n'
        'x_bucket{verb="bind",le="+Inf"} 101\n'
        'x_count{verb="bind"} 101\nx_sum{verb="bind"} 2.505\n'
        'x_bucket{verb="filter",le="0.01"} 7\n'
    )
    h = histogram_ms(before, after, "x", verb="bind")
    assert h["count"] == 100 and h["mean_ms"] == pytest.approx(25.0)
    assert h["p50_ms"] == pytest.approx(10.0) and h["p99_ms"] == pytest.approx(98.2)
    assert histogram_quantile([], 0.5) != histogram_quantile([], 0.5)  # NaN


def test_apiserver_calls_by_verb_and_resource() -> None:
    before = parse_prometheus(
        'apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 5\n'
    )
    after = parse_prometheus(
        'apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 25\n'
        'apiserver_request_total{code="200",resource="pods",verb="GET"} 3\n'
        'apiserver_watch_events_total{group="",kind="Pod",version="v1"} 60\n'
        'apiserver_watch_events_total{group="",kind="Node",version="v1"} 9\n'
    )
    assert apiserver_calls(before, after) == {
        "api_POST_pods_binding": 20.0,
        "api_GET_pods": 3.0,
        "api_watch_events_pod": 60.0,
    }


def test_pod_objects_can_be_held_by_a_scheduling_gate() -> None:
    sc = mix_scenario(4, 1, 2)
    pod = sc.pods[0].to_object("ns", "s", "t", gate=HOLD_GATE)
    assert pod["spec"]["schedulingGates"] == [{"name": HOLD_GATE}]
    assert "schedulingGates" not in sc.pods[0].to_object("ns", "s", "t")


def test_profile_top_counts_own_and_inclusive_time() -> None:
    raw = (
        "main (/x/scheduler/cli/main.py:10);filter (/x/scheduler/core/schedule.py:5) 3\n"
        "main (/x/scheduler/cli/main.py:10);bind (/x/scheduler/server/binder.py:7) 1\n"
    )
    top = profile_top(raw)
    assert "samples: 4" in top
    assert "75.0%  /x/scheduler/core/schedule.py:filter" in top
    assert "100.0%  /x/scheduler/cli/main.py:main" in top


def test_summary_renders_medians_and_gaps() -> None:
    sc = mix_scenario(50, 10, 200)
    nodes, pods = _objects(sc)
    res = replay(nodes, pods, load_params(None))
    nodes_of = {k: v[0] for k, v in res.placements.items()}
    off = placement_figures(Figures("offline", 0), sc, nodes_of, {})
    live = placement_figures(Figures("topoplace", 1), sc, nodes_of, {})
    text = render_summary(sc, {"nodes": 50}, {"topoplace": [live]}, off, res)
    assert "| nodes used | 35 | 35 | 0 |" in text
    assert "| whole nodes free | 15 | 15 | 0 |" in text


# ---- openb ----------------------------------------------------------------------------------


@pytest.mark.skipif(
    not (OPENB / "openb_node_list_gpu_node.csv").exists(),
    reason="../shared/data/alibaba-gpu-v2023 (openb traces) is not present",
)
def test_openb_scenario_whole_gpu_tasks_in_creation_order() -> None:
    sc = openb_scenario("default", OPENB)
    assert len(sc.nodes) == 1213 and sc.gpu_capacity == 6212
    assert len(sc.pods) == 3986 and sc.gpus_requested == 4355
    assert sc.gpus_requested <= sc.gpu_capacity
    assert sorted({p.gpus for p in sc.pods}) == [1, 2, 4, 8]
    assert sc.pods[0].name == "openb-pod-0000" and sc.pods[0].cpu_milli == 12000
    capped = openb_scenario("default", OPENB, max_pods=100, resources="minimal", max_nodes=50)
    assert len(capped.pods) <= 100 and capped.gpus_requested <= capped.gpu_capacity
    assert len(capped.nodes) == 50 and {p.cpu_milli for p in capped.pods} == {100}
    spec = openb_scenario("gpuspec10", OPENB)
    constrained = [p for p in spec.pods if p.gpu_models]
    assert constrained
    aff = constrained[0].to_object("ns", "topoplace", "t")["spec"]["affinity"]
    term = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]


# ---- the live run (opt-in) ------------------------------------------------------------------


@pytest.mark.skipif(
    os.environ.get("TOPOPLACE_LIVE_BENCH") != "1",
    reason="live benchmark: set TOPOPLACE_LIVE_BENCH=1 and KUBE_BIN (control-plane binaries)",
)
def test_live_benchmark_tiny(tmp_path: Path) -> None:
    from benchmarks.live import run

    kube_bin = os.environ.get("KUBE_BIN", str(kubesched.DEFAULT_KUBE_BIN))
    if not (Path(kube_bin) / "kube-scheduler").exists():
        pytest.skip(f"no kube-scheduler in {kube_bin}")
    ports = os.environ.get("TOPOPLACE_LIVE_BENCH_PORTS", "17443,24790,24800,11259,11260,8890")
    api, etcd, peer, sched, sched2, ext = ports.split(",")
    out = tmp_path / "out"
    rc = run.main(
        [
            "--scenario", "mix", "--nodes", "12", "--big", "2", "--small", "30",
            "--gangs", "1", "--gang-size", "2", "--gang-gpus", "8",
            "--idle-timeout", "10", "--kube-bin", kube_bin, "--out", str(out),
            "--work", str(Path("/tmp") / f"livebench-test-{os.getpid()}"),
            "--api-port", api, "--etcd-port", etcd, "--etcd-peer-port", peer,
            "--topoplace-sched-port", sched, "--default-sched-port", sched2, "--extender-port", ext,
        ]
    )  # fmt: skip
    assert rc == 0
    text = (out / "summary.md").read_text()
    assert "live topoplace" in text and "live default-scheduler" in text
    rows = (out / "runs.csv").read_text().splitlines()
    assert len(rows) == 4  # header, topoplace, default, offline
    assert "pods placed as offline" in text and (out / "bind-floor.csv").exists()


def test_paired_ratios_divide_within_each_run() -> None:
    def fig(arm: str, run: int, pps: float) -> Figures:
        f = Figures(arm=arm, run=run)
        f.pods_per_s = pps
        return f

    live = {
        "topoplace": [fig("topoplace", 1, 200.0), fig("topoplace", 2, 150.0)],
        "default": [fig("default", 2, 300.0), fig("default", 1, 250.0), fig("default", 3, 9.0)],
    }
    # Run 1 with run 1 and run 2 with run 2, whatever the order; run 3 has no partner.
    assert paired_ratios(live) == {"default": [0.8, 0.5]}
    assert paired_ratios({"topoplace": live["topoplace"]}) == {}


def test_summary_names_the_revision_the_live_arm_runs(tmp_path: Path) -> None:
    """With ``--topoplace-src`` the summary names the revision of that tree (read from the
    export's ``.livebench-rev``), not only the runner's; a tree that says nothing is
    reported as unknown, not as the runner's revision."""
    from benchmarks.live.run import _git_rev, _revisions

    export = tmp_path / "export"
    export.mkdir()
    assert _git_rev(export).startswith("unknown revision")
    (export / ".livebench-rev").write_text("abc1234\n")
    assert _git_rev(export) == "abc1234 (pinned export: git archive)"
    line = _revisions(str(export))
    assert line.startswith(
        f"live arm at abc1234 (pinned export: git archive) (the checkout in {export})"
    )
    assert line.endswith(f"runner and offline replay at {_git_rev()}")
    assert _revisions(None) == f"at {_git_rev()}"

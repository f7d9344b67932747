"""ComputeDomains (multi-node NVLink): pods of one domain stay in one NVLink domain
(``nvidia.com/gpu.clique``) and a node serves one domain at a time. Nodes and slices are
copies of the recorded v1.33.0 gpu-node-0; channel claims have the NVIDIA driver's shape
(a ``channel`` request, opaque ``ComputeDomainChannelConfig`` with the domain's UID)."""

from __future__ import annotations

import copy

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.kube import allocator as al
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.dra import recorded
from tests.dra.test_allocator import MockClaimApi, _claim, pod_metadata

PARAMS = SchedParams()
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
CLIQUES = {"a": "c0ffee.1", "b": "c0ffee.2", "c": "c0ffee.2"}


def _node_and_slice(name: str, clique: str) -> tuple[dict, dict]:
    node = copy.deepcopy(next(n for n in recorded.nodes() if n["metadata"]["name"] == "gpu-node-0"))
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["metadata"]["labels"]["nvidia.com/gpu.clique"] = clique
    sl = copy.deepcopy(next(s for s in recorded.slices() if s["spec"]["nodeName"] == "gpu-node-0"))
    sl["metadata"]["name"] = f"{name}-gpu.nvidia.com"
    sl["spec"]["nodeName"] = name
    sl["spec"]["pool"]["name"] = name
    return node, sl


def _channel_claim(name: str, domain: str, node: str = "") -> dict:
    c = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                "config": [
                    {
                        "requests": ["channel"],
                        "opaque": {
                            "driver": dra.CD_DRIVER,
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "ComputeDomainChannelConfig",
                                "domainID": domain,
                            },
                        },
                    }
                ],
            }
        },
    }
    if node:
        sel = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "channel",
                            "driver": dra.CD_DRIVER,
                            "pool": node,
                            "device": "channel-0",
                        }
                    ]
                },
                "nodeSelector": {"nodeSelectorTerms": [sel]},
            }
        }
    return c


def _pod(
    name: str, claims: list[str], *, gang: str = "", size: int = 0, gated: bool = True
) -> dict:
    return {
        "kind": "Pod",
        "metadata": pod_metadata(name, gang, size),
        "spec": {
            "schedulingGates": [{"name": dra.ALLOCATE_GATE}] if gated else [],
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [{"name": "c"}],
        },
    }


def _cache(claims: dict[str, dict]) -> ClusterCache:
    nodes, slices = zip(*(_node_and_slice(n, c) for n, c in CLIQUES.items()), strict=True)
    classes = recorded.classes()
    classes[CHANNEL_CLASS] = {
        "kind": "DeviceClass",
        "metadata": {"name": CHANNEL_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{dra.CD_DRIVER}'"}}]},
    }
    extra = {dra.SLICES_KEY: list(slices), dra.CLAIMS_KEY: claims, dra.CLASSES_KEY: classes}
    return ClusterCache.from_objects(list(nodes), [], PARAMS, extra=extra)


def test_channel_claims_are_not_gpus_and_name_their_domain() -> None:
    cache = _cache({})
    classes = cache.snapshot().extra[dra.CLASSES_KEY]
    ch = _channel_claim("ch", "cd-a")
    gpu = _claim("g", 2)
    assert dra.gpu_claims([ch, gpu], classes) == [gpu]
    assert dra.compute_domain_of(ch) == "cd-a"
    assert dra.compute_domain_of(gpu) == ""
    assert dra.serving_domains([_channel_claim("x", "cd-a", "a"), ch]) == {"a": frozenset({"cd-a"})}


def test_filter_keeps_one_domain_per_node_and_a_domain_in_one_clique() -> None:
    claims = {
        "default/a-ch": _channel_claim("a-ch", "cd-a", node="b"),  # cd-a runs on node b
        "default/b-ch": _channel_claim("b-ch", "cd-b"),
        "default/b-gpu": _claim("b-gpu", 2),
        "default/a-ch2": _channel_claim("a-ch2", "cd-a"),
        "default/a-gpu": _claim("a-gpu", 2),
    }
    cache = _cache(claims)
    router = DraRouter(cache)
    other = router.plans(_pod("pb", ["b-gpu", "b-ch"], gated=False), ["a", "b", "c"])
    assert {p.node: p.verdict for p in other} == {"a": "", "b": dra.REASON_CD_NODE_BUSY, "c": ""}
    assert [d.name for d in other[0].prediction.devices[0]] == ["gpu-0", "gpu-1"]  # no channel
    same = router.plans(_pod("pa", ["a-gpu", "a-ch2"], gated=False), ["a", "b", "c"])
    assert {p.node: p.verdict for p in same} == {"a": dra.REASON_CD_CLIQUE, "b": "", "c": ""}


def _setup(
    claims: dict[str, dict], pods: list[dict]
) -> tuple[ClusterCache, MockClaimApi, al.GateAllocator]:
    cache = _cache(claims)
    api = MockClaimApi(cache, claims)
    return cache, api, al.GateAllocator(cache, api, lambda: pods, settle_s=0.0)


def _gang(domain: str, gang: str, members: int) -> tuple[dict[str, dict], list[dict]]:
    claims: dict[str, dict] = {}
    pods = []
    for i in range(members):
        claims[f"default/{gang}-g{i}"] = _claim(f"{gang}-g{i}", 8)
        claims[f"default/{gang}-ch{i}"] = _channel_claim(f"{gang}-ch{i}", domain)
        pods.append(
            _pod(f"{gang}-m{i}", [f"{gang}-g{i}", f"{gang}-ch{i}"], gang=gang, size=members)
        )
    return claims, pods


def test_domain_gang_lands_in_one_nvlink_domain_or_is_refused_with_the_reason() -> None:
    claims, pods = _gang("cd-g", "g", 2)
    cache, api, alloc = _setup(claims, pods)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    nodes = sorted(dra.allocation_node(api.claims[f"default/g-g{i}"]) for i in range(2))
    assert nodes == ["b", "c"]  # the one clique with two nodes
    assert not any(dra.is_allocated(api.claims[f"default/g-ch{i}"]) for i in range(2))
    assert api.claims["default/g-g0"]["metadata"]["annotations"][dra.CD_ANNOTATION] == "cd-g"
    # A second domain cannot use b or c any more (one domain per node): it goes to a.
    claims2, pods2 = _gang("cd-h", "h", 1)
    alloc.pending = lambda: pods2
    for k, c in claims2.items():
        api.claims[k] = c
        cache.apply_claim(k, c)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    assert dra.allocation_node(api.claims["default/h-g0"]) == "a"


def test_domain_gang_no_single_nvlink_domain_can_hold() -> None:
    claims, pods = _gang("cd-g", "g", 3)  # 3 x 8 GPUs: no clique has three nodes
    cache, api, alloc = _setup(claims, pods)
    outs = alloc.step()
    assert {o.state for o in outs} == {al.WAITING}
    assert outs[0].reason.startswith(dra.REASON_CD_NO_SINGLE_CLIQUE), outs[0].reason
    assert api.writes == [] and api.ungated == []

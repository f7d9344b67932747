"""The live cluster view (``GET /ui``): its data (``GET /v1/inspect/view``) and its files.

The page is three static files shipped inside the package (``index.html``, ``app.css``,
``app.js``: no build step, no CDN, no third-party code, so it works air-gapped) that read
:func:`view_model` as JSON and draw it with plain DOM elements. The model is one read of
the extender's snapshot: the fabric as nested groups (the labelled fabric levels that
tell nodes apart, outermost first: e.g. spine, leaf, NVLink domain), every node with its
health and one state per GPU, and the pods holding GPUs (with their gang), so the page
can filter by namespace, gang and GPU product and highlight a gang without asking again.
Large clusters are drawn aggregated (a summary tile per group, zoom in on click); see
``docs/ui.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

from scheduler.core.gang import parse_reservation_key
from scheduler.core.model import RESERVATION_PREFIX, Health, mask_to_indices

PRODUCT_LABEL = "nvidia.com/gpu.product"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
}
SECURITY_HEADERS = {
    # Everything comes from the extender itself; nothing inline, nothing external.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

# GPU states in the model (one small integer per GPU keeps 2,000-node models small).
GPU_FREE = 0
GPU_BOUND = 1
GPU_ASSUMED = 2
GPU_RESERVED = 3
GPU_BAD = 4
GPU_SHARED = 5
GPU_STATES = ("free", "bound", "assumed", "reserved", "unhealthy", "shared")


def asset(name: str) -> bytes:
    """The bytes of one of the page's files (see :data:`FILES`)."""
    if name not in FILES:
        raise KeyError(name)
    return resources.files(__name__).joinpath(name).read_bytes()


def _levels_shown(nodes: Any, level_names: list[str]) -> list[int]:
    """Fabric level indices to group by, outermost first: levels with at least two
    domains among the nodes (a level every node shares tells nothing apart)."""
    shown = []
    for i in range(len(level_names) - 1, -1, -1):
        values = {n.fabric_path[i] for n in nodes if i < len(n.fabric_path)}
        if len(values - {None}) >= 2 or (len(values - {None}) == 1 and None in values):
            shown.append(i)
    return shown


def view_model(ext: Any, description: str = "") -> dict[str, Any]:
    """The cluster as the page draws it (JSON-ready). One snapshot, O(nodes + pods)."""
    snap = ext.cache.snapshot()
    levels = [lvl.name for lvl in ext.params.fabric.levels]
    shown = _levels_shown(snap.nodes, levels)
    # Pods holding GPUs; gang reservations become the gang's reserved slots.
    pods: list[dict[str, Any]] = []
    pod_at: dict[tuple[str, int], int] = {}
    state_at: dict[tuple[str, int], int] = {}
    for key in sorted(snap.pods):
        p = snap.pods[key]
        if not p.gpus and p.shares:
            # A fractional pod: its share of each GPU (memory MiB, compute milli).
            idx = len(pods)
            pods.append(
                {
                    "key": key,
                    "ns": key.split("/", 1)[0],
                    "gang": p.gang,
                    "node": p.node,
                    "gpus": [sh.gpu for sh in p.shares],
                    "state": GPU_STATES[GPU_SHARED],
                    "shares": [[sh.gpu, sh.memory_mib, sh.milli] for sh in p.shares],
                }
            )
            for sh in p.shares:
                pod_at.setdefault((p.node, sh.gpu), idx)
                state_at.setdefault((p.node, sh.gpu), GPU_SHARED)
            continue
        if not p.gpus:
            continue
        if key.startswith(RESERVATION_PREFIX):
            parsed = parse_reservation_key(key)
            gang = parsed[0] if parsed else p.gang
            state = GPU_RESERVED
            ns = gang.split("/", 1)[0]
        else:
            gang = p.gang
            state = GPU_ASSUMED if p.assumed else GPU_BOUND
            ns = key.split("/", 1)[0]
        idx = len(pods)
        pods.append(
            {
                "key": key,
                "ns": ns,
                "gang": gang,
                "node": p.node,
                "gpus": list(p.gpus),
                "state": GPU_STATES[state],
            }
        )
        for g in p.gpus:
            pod_at[(p.node, g)] = idx
            state_at[(p.node, g)] = state
    groups: dict[tuple[str | None, ...], dict[str, Any]] = {}
    root: dict[str, Any] = {"id": "", "level": "cluster", "name": "cluster", "children": []}

    def group_of(path: tuple[str | None, ...]) -> dict[str, Any]:
        parent = root
        for depth in range(1, len(path) + 1):
            sub = path[:depth]
            if sub[-1] is None:
                continue  # no domain at this level: the node sits in the parent group
            g = groups.get(sub)
            if g is None:
                level = levels[shown[depth - 1]]
                g = {
                    "id": "/".join(x or "-" for x in sub),
                    "level": level,
                    "name": sub[-1],
                    "children": [],
                }
                groups[sub] = g
                parent["children"].append(g)
            parent = g
        return parent

    nodes_out: list[dict[str, Any]] = []
    products: set[str] = set()
    for n in snap.nodes:
        path = tuple(n.fabric_path[i] if i < len(n.fabric_path) else None for i in shown)
        g = group_of(path)
        gpus = []
        holders = []
        bad = n.health.bad_mask
        for i in range(n.gpu_capacity):
            if bad >> i & 1:
                gpus.append(GPU_BAD)
            else:
                gpus.append(state_at.get((n.name, i), GPU_FREE))
            holders.append(pod_at.get((n.name, i), -1))
        product = n.labels.get(PRODUCT_LABEL, "") if n.gpu_capacity else ""
        if product:
            products.add(product)
        state = n.health.state
        health = (
            "unhealthy"
            if state >= Health.UNHEALTHY
            else "degraded"
            if state == Health.DEGRADED
            else "healthy"
        )
        g.setdefault("nodes", []).append(len(nodes_out))
        nodes_out.append(
            {
                "name": n.name,
                "product": product,
                "health": health,
                "cordoned": bool(n.health.unschedulable),
                "reasons": list(n.health.reasons),
                "unmodeled": n.unmodeled,
                "gpus": gpus,
                "pods": holders,
                "bad": list(mask_to_indices(bad)),
                "topology": n.shape.name,
            }
        )
    return {
        "cluster": description,
        "generation": snap.generation,
        "levels": [levels[i] for i in shown],
        "gpu_states": list(GPU_STATES),
        "products": sorted(products),
        "namespaces": sorted({p["ns"] for p in pods}),
        "gangs": sorted({p["gang"] for p in pods if p["gang"]} | set(_plans(ext))),
        "root": root,
        "nodes": nodes_out,
        "pods": pods,
    }


def _plans(ext: Any) -> Mapping[str, Any]:
    describe = getattr(ext.gangs, "describe_plans", None)
    return describe(ext) if callable(describe) else {}


def free_by_domain(snap: Any, fabric: Any) -> dict[tuple[str, str], int]:
    """Free healthy GPUs on schedulable nodes by (GPU product, NVLink domain, else
    accelerator, else leaf, else "none"), for the ``topoplace_free_gpus_by_domain`` gauge."""
    names = [lvl.name for lvl in fabric.levels]
    order = [names.index(x) for x in ("nvlink-domain", "accelerator", "leaf") if x in names]
    a = snap.arrays
    out: dict[tuple[str, str], int] = {}
    for i, n in enumerate(snap.nodes):
        if not n.gpu_capacity:
            continue
        domain = next(
            (n.fabric_path[j] for j in order if j < len(n.fabric_path) and n.fabric_path[j]),
            "none",
        )
        key = (n.labels.get(PRODUCT_LABEL, "unknown"), str(domain))
        free = int(a.free[i]) if int(a.blocked[i]) == 0 else 0
        out[key] = out.get(key, 0) + free
    return out


def health_counts(snap: Any) -> dict[str, int]:
    """Nodes by health state for the ``topoplace_nodes_by_health`` gauge (cordoned nodes
    count once, as cordoned)."""
    a = snap.arrays
    cordoned = a.unschedulable & (a.state < int(Health.UNHEALTHY))
    return {
        "healthy": int(((a.state == int(Health.HEALTHY)) & ~cordoned).sum()),
        "degraded": int(((a.state == int(Health.DEGRADED)) & ~cordoned).sum()),
        "unhealthy": int((a.state >= int(Health.UNHEALTHY)).sum()),
        "cordoned": int(cordoned.sum()),
    }

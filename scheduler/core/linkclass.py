"""Minimum-link requirements: can a node give k GPUs whose ring uses only good links?

A pod may ask (annotation ``topoplace.io/min-link``) that every hop of the ring NCCL would
build over its GPUs be at least a given link class: ``nvlink`` < ``pix`` < ``pxb`` <
``phb`` < ``node`` < ``sys`` (smaller is better). A set of size k qualifies when its GPUs
admit a Hamiltonian cycle (k >= 3), a link (k == 2), or trivially (k == 1), over pairs whose
class is at most the requested one. Rings, not cliques: a DGX-1's eight GPUs form an NVLink
ring although not every pair is NVLinked, and NCCL uses that ring.

For shapes of up to 10 GPUs the answer for every subset is computed once per shape with a
bitmask DP over Hamiltonian paths (2^n * n^2 steps); larger shapes use cliques (a clique of
size m contains qualifying sets of every size up to m), which is exact for NVSwitch
all-to-all machines and conservative elsewhere.

Results are memoized per (shape name, free mask): the hot path is a dict lookup.
"""

from __future__ import annotations

from functools import lru_cache

from topology.shape import GpuShape

LINK_CLASSES: tuple[str, ...] = ("nvlink", "pix", "pxb", "phb", "node", "sys")
"""Link classes, best first. The index is the class rank."""

_LABEL_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}


def link_rank(label: str) -> int:
    """Rank of an nvidia-smi topo label (0 = NVLink ... 5 = SYS). Unknown labels rank SYS."""
    if label.startswith("NV"):
        return 0
    return _LABEL_RANK.get(label, 5)


def class_rank(name: str) -> int:
    """Rank of a min-link class name.

    Raises:
        ValueError: unknown class, listing the valid ones.
    """
    try:
        return LINK_CLASSES.index(name.strip().lower())
    except ValueError:
        raise ValueError(
            f"unknown link class {name!r}; expected one of {', '.join(LINK_CLASSES)}"
        ) from None


def _adjacency(shape: GpuShape, rank: int) -> list[int]:
    n = shape.num_gpus
    adj = [0] * n
    for i in range(n):
        for j in range(n):
            if i != j and link_rank(shape.links[i][j]) <= rank:
                adj[i] |= 1 << j
    return adj


_SHAPES: dict[str, GpuShape] = {}


@lru_cache(maxsize=256)
def _qualifying_subsets(shape_name: str, n: int, rank: int) -> frozenset[int]:
    """Every subset mask (size >= 1) whose GPUs form a qualifying ring at ``rank``."""
    shape = _SHAPES[shape_name]
    adj = _adjacency(shape, rank)
    good: set[int] = set()
    if n > 10:
        raise ValueError("subset enumeration is limited to shapes of at most 10 GPUs")
    for i in range(n):
        good.add(1 << i)
        for j in range(i + 1, n):
            if adj[i] >> j & 1:
                good.add((1 << i) | (1 << j))
    # dp[mask] = bitmask of end vertices v such that a path starts at the lowest set bit of
    # mask, visits exactly mask, and ends at v.
    full = 1 << n
    dp = [0] * full
    for i in range(n):
        dp[1 << i] = 1 << i
    for mask in range(1, full):
        ends = dp[mask]
        if not ends:
            continue
        low = (mask & -mask).bit_length() - 1
        if mask.bit_count() >= 3 and ends & adj[low]:
            good.add(mask)
        v = 0
        e = ends
        while e:
            if e & 1:
                nxt = adj[v] & ~mask & ~((1 << (low + 1)) - 1)
                while nxt:
                    b = nxt & -nxt
                    dp[mask | b] |= b
                    nxt ^= b
            e >>= 1
            v += 1
    return frozenset(good)


def _max_clique_sizes(adj: list[int], free_mask: int) -> int:
    """Bitmask of sizes 1..m where m is the largest clique inside ``free_mask``."""
    import networkx as nx

    g = nx.Graph()
    nodes = [i for i in range(len(adj)) if free_mask >> i & 1]
    g.add_nodes_from(nodes)
    g.add_edges_from((i, j) for i in nodes for j in nodes if i < j and adj[i] >> j & 1)
    m = max((len(c) for c in nx.find_cliques(g)), default=0)
    return sum(1 << k for k in range(1, m + 1))


@lru_cache(maxsize=65536)
def _feasible_sizes(shape_name: str, n: int, free_mask: int) -> tuple[int, ...]:
    out = []
    if n > 10:
        shape = _SHAPES[shape_name]
        return tuple(
            _max_clique_sizes(_adjacency(shape, r), free_mask) for r in range(len(LINK_CLASSES))
        )
    for rank in range(len(LINK_CLASSES)):
        sizes = 0
        for sub in _qualifying_subsets(shape_name, n, rank):
            if sub & free_mask == sub:
                sizes |= 1 << sub.bit_count()
        out.append(sizes)
    return tuple(out)


def feasible_sizes(shape: GpuShape, free_mask: int) -> tuple[int, ...]:
    """Per link class rank, a bitmask of set sizes k that ``free_mask`` can serve.

    Bit k of element r is set when some k-subset of ``free_mask`` forms a ring whose hops
    are all of class rank <= r. Bit 0 is never set.
    """
    _SHAPES.setdefault(shape.name, shape)
    return _feasible_sizes(shape.name, shape.num_gpus, free_mask)

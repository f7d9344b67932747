"""The gang-member arrivals of ``topoplace bench verb-cost`` (``benchmarks/micro/verb_cost.py``)."""

from __future__ import annotations

from benchmarks.micro.verb_cost import GANG_SIZE, gang_case, one_run


def test_more_gangs_than_one_namespace_may_reserve_are_all_planned() -> None:
    """35 gangs of 4 x 8 GPUs, none bound: 1,120 GPUs in unbound reservations, above the
    1,024 one namespace may hold (``gang.max_reserved_gpus_per_namespace``). Each gang is
    in a namespace of its own, so every member is kept on exactly one node."""
    pods = 35 * GANG_SIZE
    _, _, _, todo = gang_case(300, pods, 0.4, 0)
    assert len({p["metadata"]["namespace"] for p, _ in todo}) == 35
    out = one_run("gang member", 300, pods, 0.4, 0)
    assert out["kept"] == [1] * pods
    assert out["offered"] == [300] * pods

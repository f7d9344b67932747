"""``weighted_sum``: ``amounts @ weights`` without BLAS, so fragmentation has the same bits
on every CPU (tests/engine/golden.json pins those bits; with ``@`` they followed OpenBLAS's
per-processor kernel and the golden FGD records failed on an AMD host)."""

from __future__ import annotations

import math

import numpy as np

from scheduler.core.sharing import weighted_sum


def test_sums_over_the_last_axis_of_any_shape() -> None:
    rng = np.random.default_rng(3)
    w = rng.random(13)
    for shape in ((13,), (5, 13), (4, 3, 13)):
        x = rng.integers(0, 8000, shape)
        got = weighted_sum(x, w)
        assert got.shape == shape[:-1]
        assert got.dtype == np.float64
        # the same value as the exact sum, to a few ulps (BLAS and pairwise differ only there)
        flat = x.reshape(-1, 13)
        exact = [
            math.fsum(float(a) * float(b) for a, b in zip(row, w, strict=True)) for row in flat
        ]
        assert np.allclose(got.reshape(-1), exact, rtol=1e-14, atol=0)


def test_a_row_sums_the_same_alone_as_within_a_batch() -> None:
    """The ledger updates one node's fragmentation alone (a 1-row batch) after computing
    all nodes at once: both must give the same bits, or a replay drifts with its history."""
    rng = np.random.default_rng(5)
    w = rng.random(29) / 7.0
    x = rng.integers(0, 16_000, (40, 29))
    batch = weighted_sum(x, w)
    for i in range(len(x)):
        assert weighted_sum(x[i : i + 1], w)[0] == batch[i]
        assert weighted_sum(x[i], w) == batch[i]

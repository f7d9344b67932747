"""Issue 12, finding 5: the pending-pod store (pods seen by filter, kept for bind) keeps only
what decisions need and is bounded in bytes and entries, evicting the oldest first."""

from __future__ import annotations

from benchmarks.clusters import dgx_h100_nodes, make_pod
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache


def _cache() -> ClusterCache:
    return ClusterCache.from_objects(dgx_h100_nodes(1), [], SchedParams())


def test_a_huge_env_is_not_kept() -> None:
    cache = _cache()
    pod = make_pod("fat", 1)
    pod["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * 20_000_000}]
    cache.remember_pending(pod)
    kept = cache.pending("default/fat")
    assert kept is not None and "env" not in kept["spec"]["containers"][0]
    assert kept["spec"]["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]
    assert cache.pending_bytes() < 10_000


def test_bounded_in_bytes_and_entries_oldest_evicted_first() -> None:
    cache = _cache()
    pods = [make_pod(f"p{i}", 1, labels={"pad": "y" * 60}) for i in range(50)]
    one = None
    for i, pod in enumerate(pods):
        cache.remember_pending(pod, max_entries=1000, max_bytes=10**9)
        if i == 0:
            one = cache.pending_bytes()
    assert one is not None and 50 * one <= cache.pending_bytes() <= 50 * (one + 2)
    cache.remember_pending(make_pod("p50", 1, labels={"pad": "y" * 60}), max_bytes=20 * one)
    assert cache.pending_bytes() <= 20 * one
    assert cache.pending("default/p0") is None and cache.pending("default/p50") is not None
    cache.remember_pending(make_pod("p51", 1, labels={"pad": "y" * 60}), max_entries=5)
    kept = [f"p{i}" for i in range(52) if cache.pending(f"default/p{i}") is not None]
    assert kept == ["p47", "p48", "p49", "p50", "p51"]
    # Seen again: it moves to the young end and survives the next eviction.
    cache.remember_pending(make_pod("p47", 1, labels={"pad": "y" * 60}), max_entries=5)
    cache.remember_pending(make_pod("p52", 1, labels={"pad": "y" * 60}), max_entries=5)
    assert cache.pending("default/p47") is not None and cache.pending("default/p48") is None
    for k in ("p47", "p49", "p50", "p51", "p52"):
        cache.drop_pending(f"default/{k}")
    assert cache.pending_bytes() == 0


def _versioned(name: str, rv: str, gpus: int = 1) -> dict:
    pod = make_pod(name, gpus)
    pod["metadata"].update(uid=f"uid-{name}", resourceVersion=rv)
    return pod


def test_the_version_held_is_only_marked_seen_and_keeps_the_filters_request() -> None:
    """The watch stores a pod, then filter sees the same version: the object held stays
    (no second redaction), it moves to the young end, and the request filter read from it
    is kept for bind; a new version replaces both."""
    cache = _cache()
    cache.remember_pending(_versioned("a", "7"))  # the watch's ADDED
    cache.remember_pending(_versioned("b", "3"))
    held = cache.pending("default/a")
    assert held is not None and cache.pending_request("default/a", held) is None
    req = object()  # what filter read (a PodRequest); kept by identity
    cache.remember_pending(_versioned("a", "7"), req)  # filter: same uid and version
    assert cache.pending("default/a") is held
    assert cache.pending_request("default/a", held) is req
    assert cache.pending_request("default/a", _versioned("a", "7")) is None  # another object
    cache.remember_pending(_versioned("c", "1"), max_entries=2)  # "b" is now the oldest
    assert cache.pending("default/b") is None and cache.pending("default/a") is held
    # The watch sees the same version again: the request stays.
    cache.remember_pending(_versioned("a", "7"))
    assert cache.pending_request("default/a", held) is req
    # A new version (or a pod without one) is stored afresh, without the old request.
    cache.remember_pending(_versioned("a", "8"))
    newer = cache.pending("default/a")
    assert newer is not held and newer["metadata"]["resourceVersion"] == "8"
    assert cache.pending_request("default/a", newer) is None
    unversioned = make_pod("a", 1)
    cache.remember_pending(unversioned)
    cache.remember_pending(unversioned, req)
    assert cache.pending("default/a") is not newer
    # Same version but another uid (the pod was deleted and made again): stored afresh.
    cache.remember_pending(_versioned("d", "5"), req)
    other = _versioned("d", "5")
    other["metadata"]["uid"] = "uid-other"
    cache.remember_pending(other)
    assert cache.pending("default/d")["metadata"]["uid"] == "uid-other"
    assert cache.pending_request("default/d", cache.pending("default/d")) is None

"""Prometheus metrics of the extender, on a registry of its own (one per app)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Metrics:
    """All metrics topoplace exports. Labels are bounded: verbs, results, constant reasons."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "topoplace_requests",
            "Extender HTTP requests by verb and status code",
            ["verb", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "topoplace_request_seconds",
            "Extender request latency by verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.filter_nodes = Counter(
            "topoplace_filter_nodes", "Filter verdicts per node by result", ["result"], registry=r
        )
        self.filter_reasons = Counter(
            "topoplace_filter_failures",
            "Nodes rejected by filter, by constant reason",
            ["reason"],
            registry=r,
        )
        self.filter_errors = Counter(
            "topoplace_filter_errors", "Filter calls answered with Error", ["reason"], registry=r
        )
        self.binds = Counter("topoplace_binds", "Bind calls by result", ["result"], registry=r)
        self.nodes = Gauge("topoplace_nodes", "Nodes in the cache", registry=r)
        self.assumed_topology = Gauge(
            "topoplace_nodes_assumed_topology",
            "GPU nodes whose interconnect is unknown and treated as all-SYS (fix their labels)",
            registry=r,
        )
        self.free_gpus = Gauge("topoplace_free_gpus", "Free healthy GPUs in the cache", registry=r)
        self.unmodeled_nodes = Gauge(
            "topoplace_unmodeled_nodes",
            "Nodes topoplace cannot model (odd GPU counts or fields): GPU pods are refused there",
            registry=r,
        )
        self.unhealthy_nodes = Gauge(
            "topoplace_unhealthy_nodes", "Nodes graded unhealthy", registry=r
        )
        self.gang_events = Counter(
            "topoplace_gang_events", "Gang planning events by kind", ["event"], registry=r
        )
        self.replacements = Counter(
            "topoplace_replacements",
            "Re-placements after hardware faults by kind",
            ["kind"],
            registry=r,
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, memoized: the verbs count on every request, and
        prometheus_client's ``labels`` validates and locks each time. Label values are
        bounded (see the class docstring), so the memo is too."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

"""Prometheus metrics of the extender, on a registry of its own (one per app).

The ``*_created`` series prometheus_client adds to every counter and histogram (a
timestamp per labelled child, doubling the series without saying anything a dashboard
uses) are turned off for the process.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

try:
    from prometheus_client import disable_created_metrics
except ImportError:  # pragma: no cover - prometheus_client < 0.17
    disable_created_metrics = None  # type: ignore[assignment]

GANG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
"""Seconds: a plan takes up to the solver limit (1 s by default); a wait, up to minutes."""

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
        if disable_created_metrics is not None:
            disable_created_metrics()
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
        self.parked_pods = Gauge(
            "topoplace_parked_pods",
            "Single GPU pods topoplace refused for want of GPUs, to be woken when a node they "
            "may use has them (kube mode), set at scrape time",
            registry=r,
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

        self.preemptions = Counter(
            "topoplace_preemptions",
            "Preemption answers by outcome (chosen: topoplace named a node and its victims; "
            "none: preempting would not help; waiting: the pod's last victims are still "
            "going; passed: kube-scheduler's victims passed through; deferred: topoplace "
            "preempts on a node kube-scheduler sees room on instead, for less)",
            ["outcome"],
            registry=r,
        )
        self.started_preemptions = Counter(
            "topoplace_started_preemptions",
            "Preemptions topoplace started for pods (and gangs) kube-scheduler sees room for "
            "but whose GPUs topoplace finds taken (started: victims evicted; none: nothing to "
            "preempt; dry_run: only logged; woken: victims gone, the pod woken or the gang "
            "planned; gave_up: victims still there after a minute)",
            ["outcome"],
            registry=r,
        )
        self.preemption_victims = Counter(
            "topoplace_preemption_victims",
            "Pods named as victims in preemption answers, by whether they belong to a gang",
            ["gang"],
            registry=r,
        )
        self.preemption_budget_violations = Counter(
            "topoplace_preemption_budget_violations",
            "Victims named in preemption answers whose eviction violates a "
            "PodDisruptionBudget (only where no node could spare them, as kube-scheduler)",
            registry=r,
        )

        self.gang_plan_seconds = Histogram(
            "topoplace_gang_plan_seconds",
            "Time the gang policy took to plan (or refuse) one gang",
            buckets=GANG_BUCKETS,
            registry=r,
        )
        self.gang_wait_seconds = Histogram(
            "topoplace_gang_wait_seconds",
            "Time from a gang's first filter to its last member bound",
            buckets=GANG_BUCKETS,
            registry=r,
        )
        self.free_gpus_by_domain = Gauge(
            "topoplace_free_gpus_by_domain",
            "Free healthy GPUs on schedulable nodes by GPU product and NVLink domain "
            "(else leaf; 'none' when unlabelled), set at scrape time",
            ["product", "domain"],
            registry=r,
        )
        self.nodes_by_health = Gauge(
            "topoplace_nodes_by_health",
            "Nodes by health state (healthy, degraded, unhealthy, cordoned), set at scrape time",
            ["state"],
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

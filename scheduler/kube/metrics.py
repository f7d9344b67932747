"""Prometheus metrics of the Kubernetes adapter, registered on the extender's registry.

Labels are bounded: resource names (a fixed set), event types, HTTP status classes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REPLACEMENT_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class KubeMetrics:
    """Watch, relist and bind-API counters. One instance per registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.registry = r
        self.watch_events = Counter(
            "topoplace_kube_watch_events",
            "Watch events applied, by resource and event type",
            ["resource", "type"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "topoplace_kube_watch_restarts",
            "Watch requests that ended in an error, by resource and reason (gone/error)",
            ["resource", "reason"],
            registry=r,
        )
        self.relists = Counter(
            "topoplace_kube_relists",
            "Full relists after 410 Gone, by resource",
            ["resource"],
            registry=r,
        )
        self.rebuilds = Counter(
            "topoplace_kube_snapshot_rebuilds",
            "Snapshot rebuilt from every stored object (0.2 s at 500 nodes, 2-3 s at 5,000 "
            "with DRA slices; filter and bind answer from the previous one meanwhile), by "
            "cause (sync, relist, resourceslices: one per burst of slice changes)",
            ["cause"],
            registry=r,
        )
        self.rebuild_seconds = Gauge(
            "topoplace_kube_snapshot_rebuild_seconds",
            "Wall-clock seconds the latest snapshot rebuild took",
            registry=r,
        )
        self.slice_updates = Counter(
            "topoplace_kube_slice_updates",
            "ResourceSlice events by how they were applied: node (only device taints "
            "changed: that node re-assessed) or rebuild (every node read again)",
            ["path"],
            registry=r,
        )
        self.slices_pending = Gauge(
            "topoplace_kube_slices_pending",
            "1 while ResourceSlice changes wait for the rebuild that applies them (a burst "
            "being gathered, or rebuilds kept to their share of the time), else 0",
            registry=r,
        )
        self.synced = Gauge(
            "topoplace_kube_synced",
            "1 once the initial list of every resource is applied",
            registry=r,
        )
        self.watch_healthy = Gauge(
            "topoplace_kube_watch_healthy",
            "1 while no watch has been broken for longer than the threshold",
            registry=r,
        )
        self.wakes = Counter(
            "topoplace_kube_pod_wakes",
            "Parked gang members touched so kube-scheduler retries them, by outcome "
            "(ok, gone, error)",
            ["outcome"],
            registry=r,
        )
        self.bind_api = Counter(
            "topoplace_kube_bind_api",
            "Binding subresource calls by outcome (ok, idempotent, conflict, not_found, "
            "timeout, unavailable, server_error, client_error)",
            ["outcome"],
            registry=r,
        )
        self.binds_in_flight = Gauge(
            "topoplace_kube_binds_in_flight", "Bind calls being processed", registry=r
        )
        self.leader = Gauge(
            "topoplace_leader",
            "1 while this replica acts (its kube-scheduler holds the Lease and the takeover "
            "is done); 0 otherwise (always 0 without serve --leader-lease)",
            registry=r,
        )
        self.evictions = Counter(
            "topoplace_remediation_evictions",
            "Pods on failed hardware (or in a gang with one) topoplace evicted, by kind "
            "(node, gpu, gang) and outcome (evicted, dry_run, blocked: a "
            "PodDisruptionBudget refused, gone, error)",
            ["kind", "outcome"],
            registry=r,
        )
        self.on_failed_hardware = Gauge(
            "topoplace_pods_on_failed_hardware",
            "Pods of topoplace's profiles holding GPUs on failed hardware (node or GPU), "
            "evicted or not yet, at the latest check",
            registry=r,
        )
        self.remediation_held = Gauge(
            "topoplace_remediation_held",
            "1 while evictions are held because too many GPU nodes failed at once "
            "(remediation.max_failed_node_share), else 0",
            registry=r,
        )
        self.replacement_seconds = Histogram(
            "topoplace_replacement_seconds",
            "From topoplace's eviction of a pod on failed hardware to its successor (same "
            "controller or gang) bound, by kind",
            ["kind"],
            buckets=REPLACEMENT_BUCKETS,
            registry=r,
        )

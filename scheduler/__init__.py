"""topoplace: topology- and health-aware kube-scheduler extender for GPU workloads."""

__version__ = "0.1.0"

"""Data, not code: policy YAML, kube-scheduler configuration, deploy manifests, demo clusters.

This file exists only so that the YAML/JSON files beside it ship inside the wheel.
"""

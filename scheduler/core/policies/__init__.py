"""Placement policies, one module per policy, registered by name (see registry.py and sharing_policies.py)."""

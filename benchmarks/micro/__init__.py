"""Micro benchmarks: in-process and loopback timing of the extender, the solver and the
topology tables, one module per benchmark registered in :mod:`benchmarks.registry`."""

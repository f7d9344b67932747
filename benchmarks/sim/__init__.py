"""Trace-driven simulator for GPU-sharing clusters (FGD paper reproduction).

Modules: ``openb`` (trace loading), ``gorand`` (Go math/rand replay), ``engine`` (event loop),
``metrics`` (allocation / fragmentation curves), ``report`` (CSV, Markdown, plots) and
``fgd_repro`` (the reproduction driver, ``python -m benchmarks.sim.fgd_repro``).
"""

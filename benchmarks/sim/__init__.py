"""The FGD paper reproduction on the Alibaba openb traces (GPU-sharing clusters).

Runs on the one engine (:mod:`benchmarks.engine`, sharing ledger). Modules: ``openb``
(trace loading), ``gorand`` (Go math/rand replay), ``artifact`` (the FGD artifact's seeded
arrival order and node ranking), ``metrics`` (the per-event recorder, allocation /
fragmentation curves), ``report`` (CSV, Markdown, plots) and ``fgd_repro`` (the driver,
``python -m benchmarks.sim.fgd_repro``; scenario file ``benchmarks/scenarios/fgd-openb.yaml``).
"""

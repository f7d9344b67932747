"""The FGD paper reproduction on the Alibaba openb traces (GPU-sharing clusters).

Runs on the one engine (:mod:`benchmarks.engine`, sharing ledger; the trace reader
:mod:`benchmarks.engine.openb`, the Go math/rand replay :mod:`benchmarks.engine.gorand` and
the FGD artifact's seeded arrival order and node ranking :mod:`benchmarks.engine.artifact`
are engine sources). Modules: ``metrics`` (the per-event recorder, allocation /
fragmentation curves), ``report`` (CSV, Markdown, plots), ``policy_compare`` (two policies
head to head) and ``run`` (the benchmark, ``topoplace bench fgd-openb``; scenario file
``benchmarks/scenarios/fgd-openb.yaml``).
"""

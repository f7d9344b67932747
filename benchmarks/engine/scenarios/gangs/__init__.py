"""Gang scenario (issue 6): whole-gang placement policies on NVL72 and DGX H100 clusters.

A seeded stream of training gangs (:mod:`.workload`, sizes and durations derived from the
Helios cluster summary) arrives at a modelled cluster; the one engine
(:mod:`benchmarks.engine`) places each gang all or nothing with one registered gang policy
on immutable snapshots (``scheduler/core`` and ``topology/`` only) and lets it run for its
duration stretched by a locality slowdown calibrated on the Pollux measurements
(:mod:`benchmarks.engine.locality`); :mod:`.metrics` records what happened. :mod:`.report` writes the CSV,
the Markdown tables and the plots; :mod:`.run` is the benchmark registered with the runner
(``topoplace bench gangs``; the scenario files: ``topoplace bench
benchmarks/scenarios/gangs-*.yaml``).
"""

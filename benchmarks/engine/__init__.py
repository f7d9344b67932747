"""The one offline engine: every offline benchmark is a scenario of one event loop.

Like kube-scheduler's ``scheduler_perf`` (one runner, many workloads), the FGD reproduction
(:mod:`.scenarios.fgd`), the gang scenario (:mod:`.scenarios.gangs`), the failure injection
(:mod:`.scenarios.faults`) and any scenario file (``benchmarks/scenarios/*.yaml``) run on:

* :mod:`.loop`: the discrete-event loop: arrivals, departures, faults (node and GPU failure
  and repair) and health signals, ordered by (time, kind, sequence); a queue served after
  every event or every instant (``reject``, ``strict-fifo``, ``best-effort-fifo``); each
  job's lifecycle (work, checkpoints, interruption, re-queue, crash, restart overhead);
  hooks for per-event metrics; invariant checks.
* :mod:`.ledger`: the cluster state, immutable snapshots (``scheduler.core.snapshot``) for
  whole GPUs, gangs and health, or the per-GPU milli-GPU arrays of the sharing model.
* :mod:`.placers`: the placement step, the code the live extender runs (``place_pod``), the
  registered gang policies, and the FGD-family sharing policies.
* :mod:`.health`: faults rendered as the signals a cluster publishes, assessed by a health
  policy (``topoplace``, ``kube-default``, ``ready-only``).
* :mod:`.scenario`, :mod:`.sources`: scenario files (format: ``benchmarks/scenarios/README.md``)
  and what their node, arrival and fault sources produce; :mod:`.openb` (the Alibaba trace
  reader), :mod:`.artifact` (the FGD artifact's seeded order and ranking) and :mod:`.gorand`
  (Go's math/rand) are sources too. Generators of a scenario package (Helios gangs, Llama 3
  faults) are registered by name (``sources.GENERATORS``): the engine imports none of them.
* :mod:`.run`: one run in any process, a sweep through :mod:`benchmarks.sweep`, reports by
  name (:mod:`.report` is the generic ``placement`` one); ``topoplace bench FILE``.
* :mod:`.replay`: a scenario file as Node objects and timed Pod objects for a live replay.

Scenario-specific behaviour is configuration, not code: the FGD artifact's Go-compatible
randomness is the run's seeded generator, its ordering an arrival source and its ties a
node ranking; the gang scenario's queue is a discipline and its locality a stretch
strategy; the failure benchmark's timing is the engine's recovery model.
"""

"""The extender's verbs, one module per kind of pod, behind one interface.

``base.py`` is the interface (:class:`~scheduler.server.verbs.base.PodKind`: filter, score,
bind, preempt, explain) and what the kinds share; ``kinds.py`` says which kind a pod is. The
kinds: ``whole.py`` (whole GPUs, and pods asking for none), ``gang.py`` (gang members),
``share.py`` (HAMi and gpushare shares), ``replica.py`` (time-slicing / MPS replicas),
``claim.py`` (DRA claims). ``preempt.py`` is the preempt verb's answer over a kind's
:class:`~scheduler.server.verbs.base.PreemptAsk`. The extender (``../extender.py``) parses the
payloads and dispatches; no module here imports it.
"""

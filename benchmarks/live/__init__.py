"""Live benchmark: replay a trace through the real kube-scheduler (topoplace as extender)
and through default-scheduler alone, against a loopback control plane, and compare both
with the offline engine on the same arrival sequence.

Opt-in: needs the control-plane binaries (``KUBE_BIN``: etcd, kube-apiserver,
kube-scheduler); the plane is the test cluster of :mod:`benchmarks.cluster`.
Modules: :mod:`kubesched` (the shipped scheduler configuration and the processes),
:mod:`kubeapi` (a small raw-REST client), :mod:`scenario` (nodes and pods of a run),
:mod:`offline` (the same sequence through ``place_pod`` and the gang policy),
:mod:`metrics` (figures from final placements and bind times), :mod:`run` (the runner).
"""

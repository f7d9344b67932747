"""topoplace's own test cluster: a real Kubernetes control plane on loopback.

etcd, kube-apiserver and optionally kube-scheduler from binaries the user names
(``KUBE_BIN``: an official release's, kind's or kwok's, or built from source; see
``docs/DEVELOPING.md``), fake GPU nodes, DRA inventory, and a stand-in for the controllers
DRA needs. The live suite (``tests/kube``) and the live benchmarks (``benchmarks.live``)
bring their planes up with it. Modules: :mod:`.cluster` (the processes), :mod:`.flags`
(what each version needs), :mod:`.pki` (credentials, kubeconfig), :mod:`.nodes`,
:mod:`.dra` (ResourceSlices, DeviceClasses), :mod:`.claims` (the claim-controller stand-in).

Command line::

    python -m benchmarks.cluster up --kube-bin DIR WORK_DIR [--nodes 4] [--dra] ...
    python -m benchmarks.cluster down WORK_DIR [--purge]
"""

from benchmarks.cluster.cluster import Cluster, ClusterError, Ports
from benchmarks.cluster.flags import Version, parse_version, plane_flags, queueing_hints_off

__all__ = [
    "Cluster",
    "ClusterError",
    "Ports",
    "Version",
    "parse_version",
    "plane_flags",
    "queueing_hints_off",
]

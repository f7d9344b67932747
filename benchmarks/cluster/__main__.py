"""``python -m benchmarks.cluster up|down|claims``: the test cluster from a shell.

``up --kube-bin DIR WORK_DIR`` starts the plane (and, with ``--nodes N``, N fake GPU nodes;
``--dra``: their GPUs as ResourceSlices instead of ``nvidia.com/gpu``), prints progress to
stderr and the kubeconfig path as the last line of stdout, and leaves the processes running
(``WORK_DIR/env.sh`` exports ``KUBECONFIG``). ``down WORK_DIR`` stops exactly the processes
recorded in ``WORK_DIR/pids``. ``claims`` runs the claim-controller stand-in (once, or every
``--loop`` seconds until SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from benchmarks.cluster.cluster import Cluster, ClusterError, Ports, stop_recorded
from benchmarks.cluster.flags import VersionError

_P = Ports()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a plane; prints the kubeconfig path last")
    up.add_argument("work", help="work folder (created)")
    up.add_argument("--kube-bin", required=True, help="folder with etcd, kube-apiserver, ...")
    up.add_argument("--api-port", type=int, default=_P.api)
    up.add_argument("--etcd-port", type=int, default=_P.etcd)
    up.add_argument("--etcd-peer-port", type=int, default=_P.etcd_peer)
    up.add_argument("--scheduler-port", type=int, default=_P.scheduler)
    up.add_argument(
        "--scheduler", action="store_true", help="also run kube-scheduler (default-scheduler)"
    )
    up.add_argument("--no-dra", action="store_true", help="do not serve resource.k8s.io")
    up.add_argument("--feature-gate", action="append", default=[], metavar="NAME=BOOL")
    up.add_argument("--runtime-config", action="append", default=[], metavar="GROUP/VER=BOOL")
    up.add_argument("--claims", action="store_true", help="run the claim-controller stand-in")
    up.add_argument(
        "--workloads", action="store_true", help="serve PodGroups (scheduling.k8s.io, >= 1.36)"
    )
    up.add_argument("--nodes", type=int, default=0, help="fake GPU nodes to create")
    up.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    up.add_argument("--sharing", choices=("device-plugin", "hami", "dra"), default="device-plugin")
    up.add_argument("--dra", action="store_true", help="same as --sharing dra (slices published)")
    up.add_argument("--mig", type=int, default=0, help="with --dra: partitionable GPUs per node")
    up.add_argument("-v", "--verbosity", type=int, default=2, help="--v of the servers")
    down = sub.add_parser("down", help="stop the processes recorded in WORK_DIR/pids")
    down.add_argument("work")
    down.add_argument("--purge", action="store_true", help="then delete WORK_DIR")
    cl = sub.add_parser("claims", help="the claim-controller stand-in")
    cl.add_argument("--kubeconfig", required=True)
    cl.add_argument("--loop", type=float, default=0.0, metavar="SECONDS")
    cl.add_argument("--keep-terminating", action="store_true")
    cl.add_argument("--work", default=None, help="the plane's folder (names this process)")
    return ap.parse_args(argv)


def cmd_up(args: argparse.Namespace) -> int:
    from benchmarks.cluster import dra, nodes

    cluster = Cluster(
        args.kube_bin,
        args.work,
        ports=Ports(args.api_port, args.etcd_port, args.etcd_peer_port, args.scheduler_port),
        dra=not args.no_dra,
        feature_gates=args.feature_gate,
        runtime_config=args.runtime_config,
        scheduler=args.scheduler,
        claims=args.claims,
        workloads=args.workloads,
        verbosity=args.verbosity,
    )
    try:
        kc = cluster.up()
    except (ClusterError, VersionError, ValueError) as exc:
        print(f"up failed: {exc}", file=sys.stderr)
        return 1
    sharing = "dra" if args.dra else args.sharing
    if args.nodes:
        api = cluster.api()
        try:
            made = nodes.create_nodes(
                api, nodes.gpu_nodes(args.nodes, gpus=args.gpus, sharing=sharing)
            )
            print(f"nodes: {', '.join(made)} ({sharing})", file=sys.stderr)
            if sharing == "dra":
                v = dra.publish(api, cluster.version, made, gpus=args.gpus, mig=args.mig)
                print(f"ResourceSlices published (resource.k8s.io/{v})", file=sys.stderr)
        except Exception as exc:
            print(f"up failed creating nodes: {exc}", file=sys.stderr)
            cluster.down()
            return 1
        finally:
            api.close()
    print(
        f"Kubernetes {cluster.release} on {cluster.server}; source {cluster.work}/env.sh; "
        f"stop with: python -m benchmarks.cluster down {cluster.work}",
        file=sys.stderr,
    )
    print(kc)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    work = Path(args.work).resolve()
    stopped = stop_recorded(work)
    print(f"stopped: {', '.join(stopped) or 'nothing running'}", file=sys.stderr)
    if args.purge and work.is_dir():
        shutil.rmtree(work)
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    from benchmarks.cluster.claims import ClaimController
    from benchmarks.live.kubeapi import Api

    api = Api(args.kubeconfig)
    ctl = ClaimController(api, interval=args.loop, force_delete=not args.keep_terminating)
    if ctl.version is None:
        print("the API server does not serve resource.k8s.io", file=sys.stderr)
        return 1
    try:
        if args.loop <= 0:
            ctl.one_pass()
            return 0
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        ctl.start()
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
        ctl.stop()
        return 0
    finally:
        api.close()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    return {"up": cmd_up, "down": cmd_down, "claims": cmd_claims}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

"""The ``topoplace`` console script.

Sub-commands: ``serve`` (the extender), ``demo`` (a scripted kube-scheduler conversation
against the embedded demo cluster), and, when their modules are present, ``topo``,
``plan``, ``bench`` and ``snapshot``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from scheduler import __version__

log = logging.getLogger("topoplace")

_OPTIONAL_COMMANDS = (
    ("scheduler.cli.topo", "add_parser"),
    ("scheduler.cli.plan", "add_parser"),
    ("scheduler.cli.bench", "add_parser"),
    ("scheduler.cli.kubecmd", "add_snapshot_parser"),
)


def _kube_configured(args: argparse.Namespace) -> bool:
    return bool(
        getattr(args, "kubeconfig", None)
        or os.environ.get("KUBECONFIG")
        or os.environ.get("KUBERNETES_SERVICE_HOST")
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="topoplace",
        description="Topology- and health-aware kube-scheduler extender for GPU workloads.",
    )
    parser.add_argument("--version", action="version", version=f"topoplace {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the extender HTTP server")
    serve.add_argument("--cluster", help="serve a cluster snapshot file (a Kubernetes List)")
    serve.add_argument("--config", help="policy YAML (default: the shipped config/policy.yaml)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8888)
    serve.add_argument("--url-prefix", default="/scheduler", help="path prefix of the verbs")
    serve.add_argument("--kubeconfig", help="learn the cluster from this Kubernetes API")
    serve.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    serve.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
    serve.add_argument(
        "--tls-client-ca", help="require client certificates signed by this CA (mTLS)"
    )
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser(
        "demo", help="replay a scripted kube-scheduler session on the demo cluster"
    )
    demo.add_argument("--cluster", help="use this cluster file instead of the demo cluster")
    demo.add_argument("--json", action="store_true", help="print the decisions as JSON")
    demo.set_defaults(func=cmd_demo)

    for module, fn in _OPTIONAL_COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            if exc.name != module:
                raise
            continue
        getattr(mod, fn)(sub)
    return parser


def load_params(path: str | None) -> Any:
    """SchedParams from a policy file (the shipped default when None)."""
    from scheduler.cli.clusterfile import load_policy
    from scheduler.core.params import SchedParams

    return SchedParams.from_config(load_policy(path))


def build_file_extender(cluster: str | None, params: Any) -> tuple[Any, str]:
    """An Extender over a cluster file (the demo cluster when ``cluster`` is None)."""
    from scheduler.cli.clusterfile import demo_cluster_path, load_cluster
    from scheduler.runtime.cache import ClusterCache
    from scheduler.server.extender import Extender

    path = cluster or str(demo_cluster_path())
    nodes, pods, extra = load_cluster(path)
    cache = ClusterCache.from_objects(nodes, pods, params, extra=extra)
    gangs = None
    try:
        from scheduler.runtime.gangs import GangRuntime  # type: ignore[attr-defined]

        gangs = GangRuntime()
    except ImportError:
        pass
    what = "embedded demo cluster" if cluster is None else f"cluster file {path}"
    return Extender(cache, gangs=gangs), what


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the extender until interrupted."""
    import uvicorn

    from scheduler.server.app import create_app

    params = load_params(args.config)
    if args.cluster:
        extender, what = build_file_extender(args.cluster, params)
        stop = None
    elif _kube_configured(args):
        from scheduler.kube.runner import build_kube_extender

        extender, stop = build_kube_extender(args.kubeconfig, params)
        what = "Kubernetes API" + (f" ({args.kubeconfig})" if args.kubeconfig else "")
    else:
        extender, what = build_file_extender(None, params)
        stop = None
        print(
            "topoplace: no --cluster and no Kubernetes configuration: serving the embedded "
            "demo cluster",
            file=sys.stderr,
        )
    snap = extender.cache.snapshot()
    log.info(
        "serving %s: %d nodes, %d GPUs free, %d node(s) with unknown interconnect",
        what,
        len(snap.nodes),
        int(snap.arrays.free.sum()),
        snap.assumed_topology_nodes,
    )
    app = create_app(extender, args.url_prefix, args.max_body_bytes, what)
    if stop is not None:
        from scheduler.kube.runner import on_app_shutdown

        on_app_shutdown(app, stop)  # uvicorn re-raises SIGTERM after serving: drain first
    ssl: dict[str, Any] = {}
    if args.tls_cert or args.tls_key or args.tls_client_ca:
        if not (args.tls_cert and args.tls_key):
            print("topoplace: --tls-cert and --tls-key go together", file=sys.stderr)
            return 2
        from scheduler.kube.tls import uvicorn_ssl_kwargs

        ssl = uvicorn_ssl_kwargs(args.tls_cert, args.tls_key, args.tls_client_ca)
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            timeout_graceful_shutdown=30,
            **ssl,
        )
    finally:
        if stop is not None:
            stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Replay the scripted kube-scheduler session and print the decisions."""
    from scheduler.cli.demo import run_demo

    return run_demo(args.cluster, as_json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from scheduler.cli.clusterfile import ClusterFileError

    try:
        return int(args.func(args) or 0)
    except (ClusterFileError, ValueError) as exc:
        print(f"topoplace: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

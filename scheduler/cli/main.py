"""The ``topoplace`` console script.

Sub-commands: ``serve`` (the extender), ``demo`` (a scripted kube-scheduler conversation
against the embedded demo cluster), ``certs`` (a CA and the key pairs for mTLS between
kube-scheduler and the extender), and, when their modules are present, ``topo``, ``plan``,
``bench`` and ``snapshot``.

Errors the user can fix (a bad flag value, a missing or malformed file, an unusable
kubeconfig, TLS files that do not load) end in one line on stderr, ``topoplace: error:
...`` (argument errors: ``topoplace COMMAND: error: ...``), and exit status 2. Output cut
short by a closed pipe (``topoplace topo show ... | head``) ends quietly with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import re
import socket
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from scheduler import __version__
from scheduler.cli.clusterfile import build_file_extender, load_params
from scheduler.server.guard import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_PER_CLIENT,
    DEFAULT_READ_TIMEOUT_S,
    HEALTH_MAX_CONNECTIONS,
    HEALTH_MAX_PER_CLIENT,
    GuardCollector,
    GuardState,
)

log = logging.getLogger("topoplace")

_OPTIONAL_COMMANDS = (
    ("scheduler.cli.topo", "add_parser"),
    ("scheduler.cli.plan", "add_parser"),
    ("scheduler.cli.bench", "add_parser"),
    ("scheduler.cli.kubecmd", "add_snapshot_parser"),
    ("scheduler.cli.explain", "add_parser"),
    ("scheduler.cli.rightsize", "add_parser"),
)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/version"})
"""What ``serve --health-port`` serves over plain HTTP: read-only, no verbs, no inspection."""
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 1


class CliError(Exception):
    """A problem the user can fix: printed as ``topoplace: error: ...``, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``PROG: error: MESSAGE``) instead of usage + error.

    Sub-parsers made with ``add_subparsers().add_parser`` are of the same class.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def port_type(text: str) -> int:
    """A TCP port, 1..65535 (argparse ``type``)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1..65535)")
    return port


def positive_int(text: str) -> int:
    """A whole number >= 1 (argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0")
    return value


def log_level(text: str) -> str:
    """A logging level name, any case (argparse ``type``)."""
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level (one of {', '.join(LOG_LEVELS)})"
        )
    return level


def _kube_configured(args: argparse.Namespace) -> bool:
    return bool(
        getattr(args, "kubeconfig", None)
        or os.environ.get("KUBECONFIG")
        or os.environ.get("KUBERNETES_SERVICE_HOST")
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = Parser(
        prog="topoplace",
        description="Topology- and health-aware kube-scheduler extender for GPU workloads.",
    )
    parser.add_argument("--version", action="version", version=f"topoplace {__version__}")
    parser.add_argument("--log-level", type=log_level, default="INFO", help=", ".join(LOG_LEVELS))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the extender HTTP server")
    serve.add_argument("--cluster", help="serve a cluster snapshot file (a Kubernetes List)")
    serve.add_argument("--config", help="policy YAML (default: the shipped config/policy.yaml)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port_type, default=8888, help="port (1..65535)")
    serve.add_argument("--url-prefix", default="/scheduler", help="path prefix of the verbs")
    serve.add_argument("--kubeconfig", help="learn the cluster from this Kubernetes API")
    serve.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=64 * 1024 * 1024,
        help="larger request bodies are refused with 413",
    )
    serve.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", help="private key of --tls-cert (PEM, not encrypted)")
    serve.add_argument(
        "--tls-client-ca", help="require client certificates signed by this CA (mTLS)"
    )
    serve.add_argument(
        "--health-port",
        type=port_type,
        help="also serve GET " + ", ".join(sorted(HEALTH_PATHS)) + " (and nothing else) over "
        "plain HTTP on this port: for kubelet probes and Prometheus when the main port "
        "requires client certificates",
    )
    serve.add_argument(
        "--health-host", help="address of --health-port (default: the same as --host)"
    )
    serve.add_argument(
        "--max-connections",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open connections on --port; more are reset at once (--health-port has its "
        f"own cap of {HEALTH_MAX_CONNECTIONS})",
    )
    serve.add_argument(
        "--max-connections-per-client",
        type=positive_int,
        default=DEFAULT_MAX_PER_CLIENT,
        help="open connections from one client address on --port "
        f"(--health-port: {HEALTH_MAX_PER_CLIENT})",
    )
    serve.add_argument(
        "--read-timeout",
        type=positive_float,
        default=DEFAULT_READ_TIMEOUT_S,
        help="seconds a client has to send a whole request (headers and body) once its "
        "connection is open or its previous answer was sent; slower connections are cut",
    )
    serve.add_argument(
        "--no-fast-lane",
        dest="fast_lane",
        action="store_false",
        help="answer the verbs through uvicorn's ASGI path instead of inside the HTTP "
        "protocol (same replies; the fast lane writes each in one piece and costs less CPU)",
    )
    serve.add_argument(
        "--leader-lease",
        metavar="NAMESPACE/NAME",
        help="HA: act only while the kube-scheduler beside this replica holds this Lease "
        "(its leaderElection resourceNamespace/resourceName); otherwise stand by with a warm "
        "cache (default: $TOPOPLACE_LEADER_LEASE; unset: always act)",
    )
    serve.add_argument(
        "--leader-identity",
        help="this replica's identity prefix in the Lease (default: the hostname, which "
        "kube-scheduler in the same pod uses as <hostname>_<uuid>)",
    )
    serve.add_argument(
        "--webhook-port",
        type=port_type,
        help="serve the right-sizer's admission webhook (POST /mutate/rightsize, policy "
        "rightsize: mode initial) over HTTPS on this port (needs --kubeconfig and the "
        "right-sizer enabled)",
    )
    serve.add_argument("--webhook-host", help="address of --webhook-port (default: --host)")
    serve.add_argument(
        "--webhook-cert", help="the webhook's certificate (PEM; default: --tls-cert)"
    )
    serve.add_argument("--webhook-key", help="key of --webhook-cert (default: --tls-key)")
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser(
        "demo", help="replay a scripted kube-scheduler session on the demo cluster"
    )
    demo.add_argument("--cluster", help="use this cluster file instead of the demo cluster")
    demo.add_argument("--json", action="store_true", help="print the decisions as JSON")
    demo.add_argument(
        "--ui",
        action="store_true",
        help="then keep serving the cluster view (/ui) on the result and open it in a browser",
    )
    demo.add_argument("--port", type=port_type, help="port of the demo's extender (default: any)")
    demo.add_argument(
        "--no-browser", action="store_true", help="with --ui: print the URL, open nothing"
    )
    demo.add_argument(
        "--verbose",
        action="store_true",
        help="also log what the in-process extender does (to stderr, at --log-level); "
        "otherwise only its warnings and errors",
    )
    demo.set_defaults(func=cmd_demo)

    from scheduler.cli.certs import add_parser as add_certs_parser

    add_certs_parser(sub)

    for module, fn in _OPTIONAL_COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            if exc.name != module:
                raise
            continue
        getattr(mod, fn)(sub)
    return parser


def _tls_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS keyword arguments from the --tls-* flags (checked now, not at the
    first handshake)."""
    if not (args.tls_cert or args.tls_key or args.tls_client_ca):
        return {}
    if not (args.tls_cert and args.tls_key):
        what = "--tls-client-ca needs" if args.tls_client_ca else "HTTPS needs both"
        raise CliError(f"{what} --tls-cert and --tls-key")
    from scheduler.kube.tls import uvicorn_ssl_kwargs

    return uvicorn_ssl_kwargs(args.tls_cert, args.tls_key, args.tls_client_ca)


def _webhook_tls(args: argparse.Namespace, params: Any, kube: bool) -> dict[str, Any]:
    """uvicorn's TLS keyword arguments of --webhook-port (an admission webhook is HTTPS
    only; the API server presents no client certificate, so none is asked for)."""
    if args.webhook_port is None:
        if args.webhook_host or args.webhook_cert or args.webhook_key:
            raise CliError("--webhook-host, --webhook-cert and --webhook-key need --webhook-port")
        return {}
    if not kube or not params.rightsize.enabled:
        raise CliError("--webhook-port needs a Kubernetes API and a rightsize: policy section")
    if args.webhook_port in (args.port, args.health_port):
        raise CliError("--webhook-port must differ from --port and --health-port")
    cert, key = args.webhook_cert or args.tls_cert, args.webhook_key or args.tls_key
    if not (cert and key):
        raise CliError("--webhook-port needs --webhook-cert and --webhook-key (or --tls-*)")
    from scheduler.kube.tls import uvicorn_ssl_kwargs

    return uvicorn_ssl_kwargs(cert, key, None)


def listen(host: str, port: int, what: str = "--host/--port") -> socket.socket:
    """A listening TCP socket on ``host:port`` (bound now, so a busy port or an unknown
    address is reported before anything else starts).

    Raises:
        CliError: the address does not resolve or cannot be bound.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(f"{what}: cannot resolve {host!r}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    try:
        return socket.create_server(address, family=family, backlog=2048)
    except OSError as exc:
        raise CliError(f"{what}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def health_only(app: Any) -> Any:
    """An ASGI app that passes ``GET`` of :data:`HEALTH_PATHS` to ``app`` and answers
    everything else with 404 (405 for other methods): the verbs and ``/v1/inspect`` are
    never reachable through it."""
    body = b'{"error":"not served on this port"}'

    async def health_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] in HEALTH_PATHS and scope["method"] == "GET":
            await app(scope, receive, send)
            return
        status = 405 if scope["path"] in HEALTH_PATHS else 404
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if status == 405:
            headers.append((b"allow", b"GET"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return health_app


def run_servers(
    app: Any,
    sock: socket.socket,
    ssl: dict[str, Any],
    health_sock: socket.socket | None = None,
    guard: GuardState | None = None,
    health_guard: GuardState | None = None,
    fast_lane: bool = True,
) -> bool:
    """Serve ``app`` on ``sock`` (with ``ssl``) and, when given, the health paths on
    ``health_sock`` (plain HTTP, no lifespan) in the same event loop, until SIGTERM/SIGINT.

    The main server owns the signals, the lifespan (drain on shutdown) and the graceful
    timeout; the health server stops with it. Each port has its own connection guard
    (``scheduler/server/guard.py``: connection caps, request read deadline; defaults when
    None). The verbs take the fast lane (``scheduler/server/fastlane.py``) unless
    ``fast_lane`` is False. Returns whether the main server started.
    """
    import asyncio

    import uvicorn

    from scheduler.server.guard import UVICORN_LEAN, raise_fd_limit, uvicorn_guard_kwargs

    raise_fd_limit()
    guard = guard or GuardState()
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=30,
        **UVICORN_LEAN,
        **uvicorn_guard_kwargs(guard, getattr(app, "verbs", None) if fast_lane else None),
        **ssl,
    )
    server = uvicorn.Server(config)
    if health_sock is None:
        server.run(sockets=[sock])
        return bool(server.started)

    class _Follower(uvicorn.Server):
        """A server that leaves the signals to the main one."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:  # uvicorn >= 0.29
            yield

        def install_signal_handlers(self) -> None:  # older uvicorn
            pass

    h_host, h_port = health_sock.getsockname()[:2]
    follower = _Follower(
        uvicorn.Config(
            health_only(app),
            host=h_host,
            port=h_port,
            log_level="warning",
            lifespan="off",
            ws="none",
            **UVICORN_LEAN,
            **uvicorn_guard_kwargs(
                health_guard
                or GuardState(HEALTH_MAX_CONNECTIONS, HEALTH_MAX_PER_CLIENT, guard.read_timeout_s)
            ),
        )
    )

    async def both() -> None:
        task = asyncio.create_task(follower.serve(sockets=[health_sock]))
        try:
            await server.serve(sockets=[sock])
        finally:
            follower.should_exit = True
            await task

    get_factory = getattr(config, "get_loop_factory", None)
    if get_factory is None:  # older uvicorn
        config.setup_event_loop()
        factory = None
    else:
        factory = get_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(both())
    return bool(server.started)


def _warm_up(extender: Any) -> None:
    """Load the gang solver now: its first import (OR-Tools) costs about a second, which the
    first gang's filter would otherwise pay."""
    if getattr(extender, "gangs", None) is None:
        return
    from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, get_policy

    get_policy(DEFAULT_GANG_POLICY)


GC_GEN0_THRESHOLD = 10_000
"""Allocations between two young-generation collections of the serving process (CPython's
default is 700). A verb or a watch event allocates a few hundred containers (the parsed
pod), so the default ran a collection for about every pod and promoted most of them."""


def _settle_heap() -> None:
    """Move everything loaded at start-up (modules, OR-Tools, the initial snapshot and pods)
    out of the cyclic garbage collector's reach, and collect young objects less often.

    Measured in a profile of the live benchmark (``topoplace bench live-mix``): the collector took
    about 15 % of the serving process's CPU, most of it full collections walking the
    start-up heap again and again. Reference counting still frees start-up objects that go
    out of use; only reference cycles among them are never reclaimed, and the start-up
    heap has none that matter (it is built once)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def _kube_options(args: argparse.Namespace) -> Any:
    """Kube-mode options: the environment's, with the --leader-* flags over them."""
    from dataclasses import replace

    from scheduler.kube.leader import parse_lease_ref
    from scheduler.kube.runner import options_from_env

    try:
        opts = options_from_env()
    except ValueError as exc:
        raise CliError(f"environment: {exc}") from None
    try:
        if args.leader_lease:
            opts = replace(opts, leader_lease=parse_lease_ref(args.leader_lease))
    except ValueError as exc:
        raise CliError(f"--leader-lease: {exc}") from None
    if args.leader_identity:
        if opts.leader_lease is None:
            raise CliError("--leader-identity needs --leader-lease")
        opts = replace(opts, leader_identity=args.leader_identity.strip())
    return opts


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the extender until interrupted.

    Everything the user can get wrong is checked before the cluster is loaded or watched:
    TLS files, the policy, the kubeconfig, and both listening addresses.
    """
    from scheduler.server.app import create_app

    ssl = _tls_kwargs(args)
    health_host = args.health_host or args.host
    if args.health_port is not None and args.health_port == args.port:
        raise CliError("--health-port must differ from --port")
    if args.health_host and args.health_port is None:
        raise CliError("--health-host needs --health-port")
    params = load_params(args.config)
    kube = not args.cluster and _kube_configured(args)
    kube_options = None
    if (args.leader_lease or args.leader_identity) and not kube:
        raise CliError("--leader-lease and --leader-identity need a Kubernetes API")
    if kube:
        from scheduler.cli.kubecmd import check_kubeconfig

        check_kubeconfig(args.kubeconfig)
        kube_options = _kube_options(args)
    webhook_ssl = _webhook_tls(args, params, kube)
    sock = listen(args.host, args.port)
    webhook_sock = None
    if args.webhook_port is not None:
        webhook_sock = listen(
            args.webhook_host or args.host, args.webhook_port, "--webhook-host/--webhook-port"
        )
    health_sock = None
    if args.health_port is not None:
        health_sock = listen(health_host, args.health_port, "--health-host/--health-port")
    if args.cluster:
        extender, what = build_file_extender(args.cluster, params)
        stop = None
    elif kube:
        from scheduler.kube.runner import build_kube_extender

        extender, stop = build_kube_extender(args.kubeconfig, params, options=kube_options)
        what = "Kubernetes API" + (f" ({args.kubeconfig})" if args.kubeconfig else "")
    else:
        extender, what = build_file_extender(None, params)
        stop = None
        print(
            "topoplace: no --cluster and no Kubernetes configuration: serving the embedded "
            "demo cluster",
            file=sys.stderr,
        )
    _warm_up(extender)
    _settle_heap()
    snap = extender.cache.snapshot()
    log.info(
        "serving %s: %d nodes, %d GPUs free, %d node(s) with unknown interconnect",
        what,
        len(snap.nodes),
        int(snap.arrays.free.sum()),
        snap.assumed_topology_nodes,
    )
    app = create_app(extender, args.url_prefix, args.max_body_bytes, what)
    rightsizer = webhook = None
    if kube and params.rightsize.enabled:
        from scheduler.kube.rightsizer import build_rightsizer

        try:
            rightsizer = build_rightsizer(
                args.kubeconfig,
                params.rightsize,
                extender,
                kube_options,
                params.sharing.gpushare_memory_unit_mib,
            )
        except ValueError as exc:
            raise CliError(str(exc)) from None
        app.state.rightsizer = rightsizer
        extender.metrics.registry.register(rightsizer)
        rightsizer.start()
        if webhook_sock is not None:
            from scheduler.server.webhook import WebhookApp, WebhookServer

            webhook = WebhookServer(
                WebhookApp(rightsizer.for_pod, params.sharing.gpushare_memory_unit_mib),
                webhook_sock,
                webhook_ssl,
            )
            webhook.start()
            log.info(
                "right-size webhook on https://%s:%d/mutate/rightsize",
                args.webhook_host or args.host,
                args.webhook_port,
            )
    if stop is not None:
        from scheduler.kube.runner import on_app_shutdown

        on_app_shutdown(app, stop)  # uvicorn re-raises SIGTERM after serving: drain first
    log.info(
        "listening on %s://%s:%d%s%s",
        "https" if ssl else "http",
        args.host,
        args.port,
        " (client certificates required)" if "ssl_cert_reqs" in ssl else "",
        f"; health on http://{health_host}:{args.health_port}" if health_sock else "",
    )
    try:
        guard = GuardState(args.max_connections, args.max_connections_per_client, args.read_timeout)
        health_guard = GuardState(HEALTH_MAX_CONNECTIONS, HEALTH_MAX_PER_CLIENT, args.read_timeout)
        watched = {"main": guard} | ({"health": health_guard} if health_sock else {})
        extender.metrics.registry.register(GuardCollector(watched))
        started = run_servers(app, sock, ssl, health_sock, guard, health_guard, args.fast_lane)
    finally:
        if webhook is not None:
            webhook.stop()
        if rightsizer is not None:
            rightsizer.stop()
        if stop is not None:
            stop()
        sock.close()
        if health_sock is not None:
            health_sock.close()
    return 0 if started else 1


def cmd_demo(args: argparse.Namespace) -> int:
    """Replay the scripted kube-scheduler session and print the decisions."""
    from scheduler.cli.demo import run_demo

    return run_demo(
        args.cluster,
        as_json=args.json,
        ui=args.ui,
        port=args.port,
        open_browser=not args.no_browser,
        verbose=args.verbose,
    )


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def error_message(exc: BaseException) -> str:
    """The one-line message for a known error."""
    message = getattr(exc, "message", None)
    if getattr(exc, "status", None) == 0 and isinstance(message, str):  # ApiUnavailable
        return _one_line(message)
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return _one_line(str(exc) or type(exc).__name__)


def _known_errors() -> tuple[type[BaseException], ...]:
    """Exceptions reported as one line (evaluated only when one is raised)."""
    from scheduler.cli.certs import CertsError

    errors: tuple[type[BaseException], ...] = (CliError, CertsError, ValueError, OSError)
    try:
        from scheduler.kube.client import ApiError
    except ImportError:
        return errors
    return (*errors, ApiError)


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is quiet
    (the recipe of the Python documentation, "Note on SIGPIPE")."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:
        return 130
    except _known_errors() as exc:
        print(f"topoplace: error: {error_message(exc)}", file=sys.stderr)
        return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    try:
        try:
            return _run(argv)
        finally:  # also after argparse's SystemExit (--help, usage errors)
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())

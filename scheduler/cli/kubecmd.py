"""Kube-facing CLI pieces: ``topoplace snapshot`` and the kube-mode entry of ``serve``.

``topoplace snapshot --kubeconfig PATH -o cluster.json`` writes the cluster as a
Kubernetes ``List`` of Nodes, Pods and PodGroups (``kind``/``apiVersion`` on every item,
no ``managedFields``): the offline format ``build_snapshot``, ``serve --cluster``, the
simulator and the tests read. By default only the pods that matter to placement are kept
(bound, holding GPUs, or in a gang: what the extender's cache sees); ``--all-pods`` keeps
every pod.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from scheduler.core.objects import meta, object_key


class KubeconfigError(ValueError):
    """The kubeconfig that would be read is missing, not YAML, or not a usable kubeconfig."""


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The file :func:`scheduler.kube.client.load_api_client` will read: ``kubeconfig``,
    else the first entry of ``$KUBECONFIG``; None when it will use the in-cluster
    configuration or ``~/.kube/config``."""
    return kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or None


def check_kubeconfig(kubeconfig: str | None, context: str | None = None) -> None:
    """Fail early, in one line, on a kubeconfig that cannot work.

    Checks the file (``kubeconfig`` or ``$KUBECONFIG``) exists, is YAML, is a mapping, and
    that its current (or the given) context names a cluster and user it defines. No
    network, and no credential plugin is run.

    Raises:
        KubeconfigError: what is wrong, with the path.
    """
    path = kubeconfig_path(kubeconfig)
    if path is None:
        return
    where = f"kubeconfig {path}" + ("" if kubeconfig else " (from $KUBECONFIG)")
    p = Path(path).expanduser()
    if not p.exists():
        raise KubeconfigError(f"{where}: no such file")
    if not p.is_file():
        raise KubeconfigError(f"{where}: not a file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KubeconfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KubeconfigError(f"{where}: not a text file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "parse error"
        raise KubeconfigError(f"{where}: not valid YAML ({problem}{at})") from None
    if not isinstance(data, dict) or not data:
        raise KubeconfigError(
            f"{where}: not a kubeconfig (expected a mapping with clusters, contexts, users)"
        )
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader

    try:
        KubeConfigLoader(config_dict=data, active_context=context)
    except ConfigException as exc:
        raise KubeconfigError(f"{where}: {exc}") from None
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise KubeconfigError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None


def snapshot_list(api: Any, all_pods: bool = False, podgroups: bool = True) -> dict[str, Any]:
    """The cluster as a ``List`` (Nodes sorted by name, then Pods, then PodGroups by key,
    then the DRA DeviceClasses, ResourceSlices and ResourceClaims when served).

    Args:
        api: a :class:`~scheduler.kube.client.KubeApi` (or anything with its methods).
        all_pods: keep every pod, not only those that matter to placement.
        podgroups: include PodGroups of the served gang APIs.

    Raises:
        ApiError: a list failed.
    """
    from scheduler.kube.client import NODES, PODS
    from scheduler.kube.watcher import POD_GROUP_KINDS, feeds_cache

    nodes = api.list(NODES).get("items") or []
    pods = [p for p in api.list(PODS).get("items") or [] if all_pods or feeds_cache(p)]
    groups: list[dict[str, Any]] = []
    if podgroups:
        for kind in POD_GROUP_KINDS:
            res = api.api_resources(kind.group, kind.version)
            names = {r.get("name") for r in (res or {}).get("resources") or ()}
            if kind.plural in names:
                groups += api.list(kind).get("items") or []
    from scheduler.core.dra import extra_of, objects_of
    from scheduler.kube.dra import discover

    dra_objs: list[dict[str, Any]] = []
    for kind in discover(api):  # ResourceSlices, ResourceClaims, DeviceClasses when served
        dra_objs += api.list(kind).get("items") or []
    items = (
        sorted(nodes, key=lambda n: str(meta(n).get("name") or ""))
        + sorted(pods, key=object_key)
        + sorted(groups, key=lambda g: (object_key(g), str(g.get("apiVersion"))))
        + objects_of(extra_of(dra_objs))
    )
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``topoplace snapshot``: write the live cluster as a cluster file."""
    from scheduler.kube.client import ApiError, KubeApi, Timeouts

    check_kubeconfig(args.kubeconfig, args.context)
    try:
        api = KubeApi.from_config(
            args.kubeconfig, args.context, Timeouts(read=float(args.request_timeout))
        )
        try:
            lst = snapshot_list(api, all_pods=args.all_pods, podgroups=not args.no_podgroups)
        finally:
            api.close()
    except ApiError as exc:
        print(f"topoplace snapshot: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    data = orjson.dumps(lst, option=orjson.OPT_INDENT_2) + b"\n"
    if args.output in (None, "-"):
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        Path(args.output).write_bytes(data)
        counts: dict[str, int] = {}
        for item in lst["items"]:
            counts[item.get("kind", "?")] = counts.get(item.get("kind", "?"), 0) + 1
        summary = (
            ", ".join(
                f"{n} {k}{'es' if k.endswith('s') else 's'}" for k, n in sorted(counts.items())
            )
            or "no objects"
        )
        print(f"wrote {args.output}: {summary}", file=sys.stderr)
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def add_snapshot_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``topoplace snapshot`` on the top-level sub-parsers."""
    p = subparsers.add_parser(
        "snapshot",
        help="write the live cluster (Nodes, Pods, PodGroups, DRA objects) as a cluster file",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, in-cluster, ~/.kube)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    p.add_argument("--all-pods", action="store_true", help="keep every pod, not only relevant ones")
    p.add_argument("--no-podgroups", action="store_true", help="leave PodGroups out")
    p.add_argument("--request-timeout", type=_seconds, default=60.0, help="seconds per list call")
    p.set_defaults(func=cmd_snapshot)
    return p


def start_kube_mode(
    params: Any,
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    broken_after_s: float | None = None,
    drain_timeout_s: float | None = None,
    scheduler_names: tuple[str, ...] = (),
    metrics: Any = None,
) -> tuple[Any, Any]:
    """Start kube mode for ``serve``: ``(extender, stop)``, already watching.

    A thin wrapper of :func:`scheduler.kube.runner.build_kube_extender` with the knobs a
    command line would expose. Serve ``create_app(extender)``; after uvicorn returns, call
    ``stop()`` (refuses new binds, drains in-flight ones, closes the watches).
    """
    from dataclasses import replace

    from scheduler.kube.runner import KubeOptions, build_kube_extender

    opts = KubeOptions(context=context, scheduler_names=tuple(scheduler_names))
    if broken_after_s is not None:
        opts = replace(opts, watch=replace(opts.watch, broken_after_s=float(broken_after_s)))
    if drain_timeout_s is not None:
        opts = replace(opts, drain_timeout_s=float(drain_timeout_s))
    return build_kube_extender(kubeconfig, params, options=opts, metrics=metrics)

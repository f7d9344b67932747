"""Scenario files: one YAML/JSON document describes a benchmark for the one engine.

The format is documented in ``benchmarks/scenarios/README.md``. In short::

    name: mix
    description: ...
    nodes: [<node source>, ...]          # inline objects, builders, a trace's node list
    arrivals: [<arrival source>, ...]    # pods, gangs, a trace's pods, seeded generators
    faults: [<fault source>, ...]        # explicit outages / GPU faults, seeded generators
    placement: {pods: place-pod, gangs: topoplace}
    queue: reject                         # reject | strict-fifo | best-effort-fifo
    serve: event                          # event | instant
    health: topoplace                     # topoplace | kube-default | ready-only
    recovery: {requeue_delay: 300, ...}
    horizon: 30d                          # seconds, or a number with s/m/h/d
    params: {gang: {...}}                 # policy.yaml sections (SchedParams.from_config)
    locality: pollux                      # stretch gang run times by their spread
    check: false                          # verify the ledger's invariants after every serve
    seed: 0
    sweep: {pod_policy: [...], seed: [...]}   # runs = every combination, in this order
    report: placement                     # placement | fgd | gangs | faults

:func:`load` reads a file into a :class:`Scenario` (relative paths resolved against the
file's directory); :meth:`Scenario.runs` expands the sweep into single runs (scenarios
without a sweep); :func:`benchmarks.engine.sources.materialize` turns a run into Node
objects, jobs and faults; :func:`benchmarks.engine.run.run_one` runs it.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.engine.loop import QUEUEING, Recovery

AXES: dict[str, str] = {
    "seed": "seed",
    "workload": "workload",
    "pod_policy": "pod_policy",
    "gang_policy": "gang_policy",
    "queue": "queue",
    "health": "health",
    "fault_rate": "fault_rate",
}
"""Sweep axes and the :class:`Scenario` field each one sets."""
REPORTS: tuple[str, ...] = ("placement", "fgd", "gangs", "faults")
HEALTH_POLICIES: tuple[str, ...] = ("topoplace", "kube-default", "ready-only")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ScenarioError(ValueError):
    """A scenario file is malformed (the message names the field)."""


@dataclass(frozen=True)
class Scenario:
    """A benchmark description (see the module docstring); a *run* has an empty sweep.

    Source entries (``nodes``, ``arrivals``, ``faults``) are kept as plain mappings with
    paths made absolute, so a run is picklable and can execute in any process.
    """

    name: str
    description: str = ""
    nodes: tuple[Mapping[str, Any], ...] = ()
    arrivals: tuple[Mapping[str, Any], ...] = ()
    faults: tuple[Mapping[str, Any], ...] = ()
    pod_policy: str = "place-pod"
    gang_policy: str = "topoplace"
    ties: str = "name"
    rank_skip: int = 0
    queue: str = "reject"
    serve: str = "event"
    health: str = "topoplace"
    recovery: Recovery = Recovery()
    horizon: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    locality: str = ""
    check: bool = False
    namespace: str = "sim"
    seed: int = 0
    workload: str = ""
    fault_rate: float = 1.0
    sweep: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    report: str = "placement"

    def runs(self) -> list[Scenario]:
        """Every combination of the sweep's values (first axis outermost), as runs."""
        if not self.sweep:
            return [self]
        names = [a for a, _ in self.sweep]
        out = []
        for values in itertools.product(*(v for _, v in self.sweep)):
            point = {AXES[a]: v for a, v in zip(names, values, strict=True)}
            out.append(replace(self, sweep=(), **point))
        return out

    def value(self, axis: str) -> Any:
        """The value of a sweep axis in this run."""
        return getattr(self, AXES[axis])


def _duration(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([smhd])\s*", str(value))
    if not m:
        raise ScenarioError(f"{where}: {value!r} is not a duration (seconds, or e.g. 30d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_seeds(value: Any) -> tuple[int, ...]:
    """``42``, ``[42, 43]``, ``"42-51"`` or ``"1-3,7"`` as a tuple of seeds (in order given)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(s for v in value for s in parse_seeds(v))
    out: list[int] = []
    for part in str(value).replace(" ", ",").split(","):
        if not part:
            continue
        if "-" in part[1:]:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    if not out:
        raise ScenarioError(f"no seeds in {value!r}")
    return tuple(out)


def _absolute(entry: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``entry`` with every ``path`` / ``file`` value resolved against ``base``."""
    out: dict[str, Any] = {}
    for k, v in entry.items():
        if isinstance(v, Mapping):
            out[k] = _absolute(v, base)
        elif k in ("path", "file") and isinstance(v, str):
            out[k] = str((base / v).resolve())
        else:
            out[k] = v
    return out


_KEYS = {f.name for f in fields(Scenario)} - {
    "pod_policy", "gang_policy", "ties", "rank_skip", "sweep"
} | {"placement", "sweep"}  # fmt: skip


def from_mapping(doc: Mapping[str, Any], base: str | Path = ".") -> Scenario:
    """A scenario from a parsed document; relative paths resolve against ``base``.

    Raises:
        ScenarioError: unknown keys, bad values.
    """
    if not isinstance(doc, Mapping):
        raise ScenarioError("a scenario is a mapping")
    unknown = set(doc) - _KEYS
    if unknown:
        raise ScenarioError(f"unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
    if not doc.get("name"):
        raise ScenarioError("name is required")
    root = Path(base)

    def entries(key: str) -> tuple[dict[str, Any], ...]:
        items = doc.get(key) or []
        if not isinstance(items, list) or not all(isinstance(x, Mapping) for x in items):
            raise ScenarioError(f"{key}: a list of mappings")
        return tuple(_absolute(x, root) for x in items)

    pl = dict(doc.get("placement") or {})
    bad = set(pl) - {"pods", "gangs", "ties", "rank_skip"}
    if bad:
        raise ScenarioError(f"placement: unknown keys {sorted(bad)}")
    rec = dict(doc.get("recovery") or {})
    bad = set(rec) - {f.name for f in fields(Recovery)}
    if bad:
        raise ScenarioError(f"recovery: unknown keys {sorted(bad)}")
    sweep = []
    for axis, values in (doc.get("sweep") or {}).items():
        if axis not in AXES:
            raise ScenarioError(f"sweep: unknown axis {axis!r}; known: {', '.join(AXES)}")
        if axis == "seed":
            vals: tuple[Any, ...] = parse_seeds(values)
        elif isinstance(values, list):
            vals = tuple(values)
        else:
            vals = tuple(x.strip() for x in str(values).split(",") if x.strip())
        if axis == "fault_rate":
            vals = tuple(float(v) for v in vals)
        if not vals:
            raise ScenarioError(f"sweep: axis {axis!r} has no values")
        sweep.append((axis, vals))
    sc = Scenario(
        name=str(doc["name"]),
        description=str(doc.get("description") or ""),
        nodes=entries("nodes"),
        arrivals=entries("arrivals"),
        faults=entries("faults"),
        pod_policy=str(pl.get("pods", "place-pod")),
        gang_policy=str(pl.get("gangs", "topoplace")),
        ties=str(pl.get("ties", "name")),
        rank_skip=int(pl.get("rank_skip", 0)),
        queue=str(doc.get("queue", "reject")),
        serve=str(doc.get("serve", "event")),
        health=str(doc.get("health", "topoplace")),
        recovery=Recovery(**{k: _duration(v, f"recovery.{k}") for k, v in rec.items()}),
        horizon=_duration(doc["horizon"], "horizon") if doc.get("horizon") is not None else None,
        params=dict(doc.get("params") or {}),
        locality=str(doc.get("locality") or ""),
        check=bool(doc.get("check", False)),
        namespace=str(doc.get("namespace", "sim")),
        seed=int(doc.get("seed", 0)),
        workload=str(doc.get("workload") or ""),
        fault_rate=float(doc.get("fault_rate", 1.0)),
        sweep=tuple(sweep),
        report=str(doc.get("report", "placement")),
    )
    validate(sc)
    return sc


def validate(sc: Scenario) -> None:
    """Check the enumerated fields of ``sc`` and of every run of its sweep.

    Raises:
        ScenarioError: the first problem found.
    """
    for run in sc.runs():
        if run.queue not in QUEUEING:
            raise ScenarioError(f"queue {run.queue!r} is not one of {', '.join(QUEUEING)}")
        if run.serve not in ("event", "instant"):
            raise ScenarioError("serve is 'event' or 'instant'")
        if run.health not in HEALTH_POLICIES:
            raise ScenarioError(f"health {run.health!r} is not one of {HEALTH_POLICIES}")
        if run.ties not in ("name", "go-rank"):
            raise ScenarioError("placement.ties is 'name' or 'go-rank'")
        if run.report not in REPORTS:
            raise ScenarioError(f"report {run.report!r} is not one of {', '.join(REPORTS)}")
        if run.locality not in ("", "pollux"):
            raise ScenarioError("locality is 'pollux' or absent")


def load(path: str | Path) -> Scenario:
    """Read a scenario file (YAML, or JSON by its ``.json`` suffix).

    Raises:
        OSError: unreadable file.
        ScenarioError: malformed scenario.
    """
    p = Path(path)
    text = p.read_text()
    doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    return from_mapping(doc, p.resolve().parent)


def seeds_of(runs: Sequence[Scenario]) -> list[int]:
    """Distinct seeds of ``runs``, in first-seen order."""
    return list(dict.fromkeys(r.seed for r in runs))

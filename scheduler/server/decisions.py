"""Decision records: a bounded in-memory ring of what the extender decided, explained on demand.

Recording is cheap on purpose (filter and prioritize are the hot path): a record keeps
references to the decision's inputs, the immutable snapshot it was made on, the request
and the candidate positions, and nothing is computed until someone asks
(``GET /v1/inspect/decisions``, ``topoplace explain``, the demo), when
:func:`scheduler.core.explain.explain` takes the decision apart. Same inputs, same
answer: the explanation is the decision's, not a later re-run on a changed cluster.

The ring is bounded in records and in estimated bytes: each record's candidate
positions, plus each snapshot held by any record once (its node arrays and tables;
records of one generation share their snapshot). The oldest records go first.

Gang decisions are recorded as the plan or refusal the gang runtime produced (small
JSON-ready dicts), and a member's filter as the planned node it was given.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from scheduler.core.explain import PARTS, explain, summarize
from scheduler.core.model import PodRequest
from scheduler.core.snapshot import ClusterSnapshot

DEFAULT_MAX_RECORDS = 2048
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
RECORD_OVERHEAD = 256
"""Bytes counted per record besides what it references (the record itself)."""
SUMMARY_MAX_CHARS = 400
"""The one-line summary written into the placement record is cut to this length."""


@dataclass(slots=True)
class Record:
    """One decision. ``snap``/``req``/``pos`` for single pods, ``info`` for gangs."""

    seq: int
    at: float
    verb: str
    pod: str
    gang: str = ""
    snap: ClusterSnapshot | None = None
    req: PodRequest | None = None
    pos: np.ndarray | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    size: int = RECORD_OVERHEAD
    basis: tuple[np.ndarray, np.ndarray] | None = None
    """The filter's ``(codes, rank)`` at ``pos`` when it ranked (decide_in_filter)."""


def _snapshot_bytes(snap: ClusterSnapshot) -> int:
    a = snap.arrays
    arrays = sum(getattr(a, f).nbytes for f in a.__dataclass_fields__)
    return arrays + 8 * len(snap.nodes) + 200 * len(snap.pods)


class DecisionLog:
    """The ring of decision records (thread-safe; bind runs on worker threads).

    Args:
        params: returns the scheduling parameters the decisions were made with.
        max_records / max_bytes: bounds of the ring.
        clock: wall-clock seconds, stamped on each record.
    """

    def __init__(
        self,
        params: Callable[[], Any],
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._params = params
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._ring: deque[Record] = deque()
        self._held: dict[int, list[int]] = {}  # id(snapshot) -> [records holding it, bytes]
        self._bytes = 0
        self._seq = 0

    # ---- recording (cheap) ---------------------------------------------------------------

    def record(
        self,
        verb: str,
        snap: ClusterSnapshot,
        req: PodRequest,
        pos: np.ndarray,
        basis: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Record a single pod's filter or prioritize decision: references only (and the
        filter's ``(codes, rank)`` when it ranked, so that bind's summary reuses them)."""
        rec = Record(0, self._clock(), verb, req.key, req.gang, snap, req, pos, basis=basis)
        rec.size = RECORD_OVERHEAD + int(pos.nbytes)
        if basis is not None:
            rec.size += int(basis[0].nbytes + basis[1].nbytes)
        self._add(rec)

    def record_info(self, verb: str, pod: str, gang: str, info: Mapping[str, Any]) -> None:
        """Record a gang decision (a plan, a refusal, a member's planned node)."""
        rec = Record(0, self._clock(), verb, pod, gang, info=info)
        rec.size = RECORD_OVERHEAD + len(orjson.dumps(info, default=str))
        self._add(rec)

    def _add(self, rec: Record) -> None:
        # The snapshot's bytes are counted outside the lock when it looks new (a racy
        # peek: at worst counted for nothing), and evicted records are released after it
        # (the last record of a snapshot frees it), so the lock is held for bookkeeping only.
        snap = rec.snap
        size = _snapshot_bytes(snap) if snap is not None and id(snap) not in self._held else -1
        with self._lock:
            self._seq += 1
            rec.seq = self._seq
            if snap is not None:
                held = self._held.get(id(snap))
                if held is None:
                    if size < 0:
                        size = _snapshot_bytes(snap)
                    self._held[id(snap)] = [1, size]
                    self._bytes += size
                else:
                    held[0] += 1
            self._ring.append(rec)
            self._bytes += rec.size
            gone = []
            while self._ring and (
                len(self._ring) > self.max_records or self._bytes > self.max_bytes
            ):
                gone.append(self._evict())
        del gone  # the evicted records (and snapshots no record holds now) go here

    def _evict(self) -> Record:
        """Drop the oldest record, and the bytes of its snapshot with the last record
        holding it (records keep their snapshot alive, so ids stay unique while held).
        Returns the record (the caller lets it go outside the lock)."""
        old = self._ring.popleft()
        self._bytes -= old.size
        if old.snap is not None:
            held = self._held[id(old.snap)]
            held[0] -= 1
            if held[0] == 0:
                del self._held[id(old.snap)]
                self._bytes -= held[1]
        return old

    # ---- reading (explains on demand) ----------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Records held, estimated bytes, and the bounds."""
        with self._lock:
            return {
                "records": len(self._ring),
                "bytes": self._bytes,
                "max_records": self.max_records,
                "max_bytes": self.max_bytes,
                "recorded": self._seq,
            }

    def records(self, pod: str | None = None, limit: int = 20) -> list[Record]:
        """The newest records, newest first: of ``pod`` and the plans and refusals of its
        gang, or all."""
        with self._lock:
            ring = list(self._ring)
        ring.reverse()
        if pod is not None:
            gangs = {r.gang for r in ring if r.pod == pod and r.gang}
            ring = [
                r
                for r in ring
                if r.pod == pod or (r.gang in gangs and r.verb in ("plan", "refusal"))
            ]
        return ring[: max(0, limit)]

    def gang_plan(self, gang: str) -> Mapping[str, Any] | None:
        """The newest plan recorded for ``gang``."""
        with self._lock:
            for r in reversed(self._ring):
                if r.gang == gang and r.verb == "plan":
                    return r.info
        return None

    def explained(self, rec: Record, chosen: str | None = None) -> dict[str, Any]:
        """The record as JSON: the full explanation for a single pod's decision."""
        base = {"seq": rec.seq, "at": round(rec.at, 3), "verb": rec.verb, "pod": rec.pod}
        if rec.gang:
            base["gang"] = rec.gang
        if rec.snap is not None and rec.req is not None and rec.pos is not None:
            body = explain(rec.snap, rec.req, rec.pos, self._params(), rec.verb, chosen)
            return {**body, **base}
        return {**base, **dict(rec.info), "summary": info_summary(rec.verb, rec.gang, rec.info)}

    def explain_pod(self, pod: str, limit: int = 20) -> list[dict[str, Any]]:
        """Every record of ``pod`` held (newest first), explained."""
        return [self.explained(r) for r in self.records(pod, limit)]

    def latest(self, pod: str, verbs: tuple[str, ...] = ("filter", "prioritize")) -> Record | None:
        """The newest single-pod record of ``pod`` made by one of ``verbs``."""
        with self._lock:
            for r in reversed(self._ring):
                if r.pod == pod and r.verb in verbs and r.snap is not None:
                    return r
        return None

    def bind_summary(self, pod: str, node: str) -> str:
        """The one-line why of binding ``pod`` to ``node``, from its latest filter or
        prioritize record ("" when there is none)."""
        rec = self.latest(pod)
        if rec is None or rec.req is None or rec.pos is None or rec.snap is None:
            return ""
        line = summarize(
            rec.snap, rec.req, rec.pos, self._params(), rec.verb, chosen=node, basis=rec.basis
        )
        return line[:SUMMARY_MAX_CHARS]


def _solver_bits(d: Mapping[str, Any]) -> list[str]:
    bits = []
    if d.get("solver_status"):
        text = f"solver {d['solver_status']}, objective {d.get('objective')}"
        if d.get("gap") is not None:
            text += f", gap {d['gap']}"
        bits.append(text)
    used = d.get("domains_used") or {}
    doms = ", ".join(f"{k} {v}" for k, v in used.items() if k != "node")
    if doms:
        bits.append(f"domains used: {doms}")
    return bits


def gang_member_summary(plan: Mapping[str, Any], node: str) -> str:
    """One line for a gang member's placement record: its plan and the solver's numbers."""
    slots = plan.get("slots") or []
    bits = [f"gang {plan.get('gang')} plan {plan.get('plan')} ({plan.get('policy')})"]
    bits.append(f"{node} holds 1 of {len(slots)} slots")
    bits += _solver_bits(plan.get("details") or {})
    return "; ".join(bits)[:SUMMARY_MAX_CHARS]


def info_summary(verb: str, gang: str, info: Mapping[str, Any]) -> str:
    """One line for a gang record, a bind record or a fractional pod's record."""
    if info.get("kind") == "share":
        c = info.get("chosen")
        if not c:
            reasons = ", ".join(f"{n}x {r}" for r, n in (info.get("reasons") or {}).items())
            return f"no node has a GPU with room for the share ({reasons or 'no candidates'})"
        shares = "; ".join(f"GPU {g} {m} MiB {k // 10} % SMs" for g, m, k in c["shares"])
        line = (
            f"shares {shares} of {c['node']}: sharing policy {info.get('policy')} scores it "
            f"{c['policy_score']}/100 (prioritize {c['score']}/10) among {info.get('feasible')}"
            " node(s) that fit"
        )
        runners = info.get("runners_up") or []
        if runners:
            line += f"; runner-up {runners[0]['node']}: {runners[0]['why_lost']}"
        return line
    if verb == "plan":
        slots = info.get("slots") or []
        nodes = sorted({s["node"] for s in slots})
        bits = [
            f"gang {gang} planned by {info.get('policy')} (plan {info.get('plan')}): "
            f"{len(slots)} slots on {', '.join(nodes[:6])}{' ...' if len(nodes) > 6 else ''}"
        ]
        return "; ".join(bits + _solver_bits(info.get("details") or {}))
    if verb == "refusal":
        bits = [
            f"gang {gang} refused: {info.get('reason')}",
            f"{info.get('members')} members, {info.get('gpus_requested_by_members_seen')} "
            f"GPUs asked by the members seen, {info.get('free_gpus')} free GPUs on "
            f"schedulable nodes",
        ]
        return "; ".join(bits + _solver_bits(info.get("details") or {}))
    if verb == "bind":
        if info.get("error"):
            return f"bind to {info.get('node')} failed: {info['error']}"
        gpus = ",".join(map(str, info.get("gpus") or []))
        return f"bound to {info.get('node')} GPUs {gpus}" + (
            f": {info['why']}" if info.get("why") else ""
        )
    if info.get("planned_node") and verb == "prioritize":
        return (
            f"gang member: its planned node {info['planned_node']} scores {info.get('score')} "
            f"(gang plan {info.get('score')}), every other node 0"
        )
    if info.get("planned_node"):
        return f"gang member: its planned node is {info['planned_node']}"
    reasons = info.get("reasons") or {}
    return (
        "gang member: no node offered (" + "; ".join(f"{n}x {r}" for r, n in reasons.items()) + ")"
    )


__all__ = ["PARTS", "DecisionLog", "Record", "gang_member_summary", "info_summary"]

"""The preempt verb's answer, once the pod's kind has said what it needs (:class:`PreemptAsk`).

topoplace chooses the node and its victims (``core.preemption.select_victims``) among
kube-scheduler's candidates and answers with that node alone, or an empty map when
preempting would not help (kube-scheduler then evicts nothing):

* nothing more while an earlier preemption for the pod (or topoplace's own for its gang)
  still stands: its victims are going, or there is room on its node now;
* a gang member only within its gang's placement with every lower-priority pod gone (the
  kind's ``scope``);
* nothing when topoplace has started a cheaper preemption elsewhere, on a node
  kube-scheduler sees room on (``started_preemption.cheaper_elsewhere``).

The answer goes into the preemption ledger with the gangs its victims break (their other
members are evicted too, in kube mode, by the remediator) and into the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from scheduler.core.model import PodRequest
from scheduler.core.preemption import broken_gangs, fits_on, select_victims
from scheduler.core.remediation import being_deleted
from scheduler.runtime.stranded import gang_record_key
from scheduler.server import started_preemption
from scheduler.server.verbs.base import Host, PreemptAsk

log = logging.getLogger(__name__)


def answer(
    ext: Host,
    req: PodRequest,
    victims: Mapping[str, Any],
    ask: PreemptAsk,
) -> dict[str, Any]:
    """The ``ExtenderPreemptionResult`` for ``req`` given kube-scheduler's candidate
    ``victims`` (node -> its ``MetaVictims`` pods) and what the pod's kind asks."""
    share = ask.share
    snap = ext.cache.snapshot()
    live = {p.uid for p in snap.pods.values() if p.uid and not being_deleted(p)}
    started = ext.stranded.get(gang_record_key(req.gang)) if req.gang else None
    if ext.preemptions.waiting_for(
        req.key,
        live.__contains__,
        lambda node: not fits_on(snap, req, node, ext.params, share),
    ):
        waiting = "its last preemption still stands (victims going, or room on its node now)"
    elif started is not None and started.node:
        waiting = f"topoplace's preemption for its gang still going (victims on {started.node})"
    else:
        waiting = ""
    if waiting:
        ext.metrics.child(ext.metrics.preemptions, "waiting").inc()
        log.info("preemption for %s: %s; none more", req.key, waiting)
        return {"NodeNameToMetaVictims": {}}
    proposed = {node: {v["UID"] for v in vs} for node, vs in victims.items()}
    within, why = ask.scope(snap) if ask.scope is not None else (None, "")
    decision = select_victims(snap, req, proposed, ext.params, within, share) if not why else None
    chosen = decision.chosen if decision is not None else None
    elsewhere = started_preemption.cheaper_elsewhere(ext, snap, req, share, chosen)
    if elsewhere is not None:
        why = (
            f"topoplace preempts on {elsewhere.node} instead, where kube-scheduler sees "
            f"room (victims {', '.join(v.pod for v in elsewhere.victims)})"
        )
        chosen = None
    record = {
        "pod": req.key,
        "priority": req.priority,
        "gpus": req.gpus,
        "share": share.form if share is not None else "",
        "proposed": {n: len(v) for n, v in sorted(proposed.items())},
        "chosen": chosen.as_dict() if chosen is not None else None,
        "options": len(decision.options) if decision is not None else 0,
        "refused": dict(decision.refused) if decision is not None else {},
        "reason": why,
    }
    broken = broken_gangs(snap, chosen, req.key) if chosen is not None else []
    ext.preemptions.record(
        record,
        broken,
        req.key,
        [v.uid for v in chosen.victims] if chosen else (),
        chosen.node if chosen else "",
    )
    if chosen is None:
        outcome = "deferred" if elsewhere is not None else "none"
        ext.metrics.child(ext.metrics.preemptions, outcome).inc()
        log.info(
            "preemption for %s: no victims named (%s)",
            req.key,
            why or "; ".join(f"{n}: {r}" for n, r in sorted(record["refused"].items())[:5]),
        )
        return {"NodeNameToMetaVictims": {}}
    ext.metrics.child(ext.metrics.preemptions, "chosen").inc()
    for v in chosen.victims:
        ext.metrics.child(ext.metrics.preemption_victims, "yes" if v.gang else "no").inc()
    ext.metrics.preemption_budget_violations.inc(chosen.pdb_violations)
    log.info(
        "preemption for %s: %s, victims %s (gangs broken: %s)",
        req.key,
        chosen.node,
        ", ".join(v.pod for v in chosen.victims),
        ", ".join(chosen.gangs_broken) or "none",
    )
    return {
        "NodeNameToMetaVictims": {
            chosen.node: {
                "Pods": [{"UID": v.uid} for v in chosen.victims],
                # topoplace's own count for its victims (one node is answered, so
                # kube-scheduler nominates it whatever the count)
                "NumPDBViolations": chosen.pdb_violations,
            }
        }
    }

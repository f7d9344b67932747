"""Issue 12, finding 9: the shipped manifests wire HA as docs/deploy.md describes: two
replicas, the sidecar follows the Lease its own kube-scheduler elects on, and the
ServiceAccount may read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "config" / "deploy"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_sidecar_follows_the_lease_kube_scheduler_elects_on() -> None:
    (dep,) = _docs("deployment.yaml")
    assert dep["spec"]["replicas"] == 2
    containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
    argv = containers["topoplace"]["command"]
    lease = argv[argv.index("--leader-lease") + 1]
    (cm,) = _docs("scheduler-config.yaml")
    le = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases"
    assert lease == f"{le['resourceNamespace']}/{le['resourceName']}"
    # The identity is the hostname (no --leader-identity, no hostname override in the pod):
    # both containers share it, and kube-scheduler writes <hostname>_<uuid>.
    assert "--leader-identity" not in argv
    assert "hostname" not in dep["spec"]["template"]["spec"]


def test_the_service_account_may_get_that_lease() -> None:
    (dep,) = _docs("deployment.yaml")
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    (cm,) = _docs("scheduler-config.yaml")
    le = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["leaderElection"]
    docs = _docs("rbac.yaml")
    roles = {
        (d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] == "Role"
    }
    allowed = False
    for b in (d for d in docs if d["kind"] == "RoleBinding"):
        ns = b["metadata"]["namespace"]
        if ns != le["resourceNamespace"] or not any(
            s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]
        ):
            continue
        role = roles.get((ns, b["roleRef"]["name"]))
        for rule in (role or {}).get("rules", []):
            if (
                "coordination.k8s.io" in rule["apiGroups"]
                and "leases" in rule["resources"]
                and "get" in rule["verbs"]
                and le["resourceName"] in rule.get("resourceNames", [le["resourceName"]])
            ):
                allowed = True
    assert allowed

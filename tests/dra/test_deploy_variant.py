"""The DRA deploy variant (config/deploy/dra/) stays the shipped configuration minus
managedResources, and the RBAC covers what DRA needs."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from benchmarks.live.kubesched import CONFIG_KEY, load_shipped

REPO = Path(__file__).resolve().parents[2]
VARIANT = REPO / "config" / "deploy" / "dra" / "scheduler-config-dra.yaml"


def test_dra_variant_is_the_shipped_config_without_managed_resources() -> None:
    shipped = load_shipped()
    dra = load_shipped(VARIANT)
    assert [e.get("managedResources") for e in dra["extenders"]] == [None]
    expected = copy.deepcopy(shipped)
    for e in expected["extenders"]:
        e.pop("managedResources", None)
    assert dra == expected


def test_dra_overlay_patches_the_base_config_map() -> None:
    kust = yaml.safe_load((VARIANT.parent / "kustomization.yaml").read_text())
    assert kust["resources"] == ["../"]
    assert {"path": VARIANT.name} in kust["patches"]
    patch = yaml.safe_load(VARIANT.read_text())
    base = yaml.safe_load((REPO / "config" / "deploy" / "scheduler-config.yaml").read_text())
    assert (patch["kind"], patch["metadata"]) == (base["kind"], base["metadata"])
    assert list(patch["data"]) == [CONFIG_KEY]


def test_rbac_lets_both_containers_use_dra() -> None:
    docs = list(yaml.safe_load_all((REPO / "config" / "deploy" / "rbac.yaml").read_text()))
    roles = {d["metadata"]["name"]: d for d in docs if d and d["kind"] == "ClusterRole"}

    def allows(role: str, verb: str, resource: str) -> bool:
        return any(
            "resource.k8s.io" in r["apiGroups"]
            and resource in r["resources"]
            and verb in r["verbs"]
            for r in roles[role]["rules"]
        )

    for role in ("topoplace:kube-scheduler", "topoplace:extender"):
        for res in ("resourceslices", "resourceclaims", "deviceclasses"):
            for verb in ("get", "list", "watch"):
                assert allows(role, verb, res), (role, verb, res)
        assert allows(role, "update", "resourceclaims")
        assert allows(role, "update", "resourceclaims/status")
    assert not allows("topoplace:extender", "delete", "resourceclaims")
    assert not allows("topoplace:extender", "update", "resourceslices")

"""The DRA deploy variant (the component config/deploy/dra/) stays the shipped configuration
minus managedResources, its combination with mTLS (config/overlays/dra-mtls) stays the DRA
variant plus the mTLS component's extender transport, and the RBAC covers what DRA needs.
(tests/test_manifests.py builds the overlays with kubectl.)"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from benchmarks.live.kubesched import CONFIG_KEY, load_shipped

REPO = Path(__file__).resolve().parents[2]
VARIANT = REPO / "config" / "deploy" / "dra" / "scheduler-config-dra.yaml"
MTLS_VARIANT = REPO / "config" / "deploy" / "mtls" / "scheduler-config-mtls.yaml"
DRA_MTLS = REPO / "config" / "overlays" / "dra-mtls"


def test_dra_variant_is_the_shipped_config_without_managed_resources() -> None:
    """The same configuration, with managedResources dropped and the resources it told
    kube-scheduler to ignore (HAMi's per-device memory and compute) moved to
    NodeResourcesFit's ignoredResources: without them no HAMi share would fit a node."""
    shipped = load_shipped()
    dra = load_shipped(VARIANT)
    assert [e.get("managedResources") for e in dra["extenders"]] == [None]
    expected = copy.deepcopy(shipped)
    ignored = []
    for e in expected["extenders"]:
        ignored += [m["name"] for m in e.pop("managedResources", ()) if m["ignoredByScheduler"]]
    assert ignored == ["nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"]
    (fit,) = [c for c in expected["profiles"][0]["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    fit["args"] = {"ignoredResources": ignored, **fit["args"]}
    assert dra == expected


def _transport(cfg: dict) -> tuple[str, object, object]:
    (ext,) = cfg["extenders"]
    return ext["urlPrefix"], ext.get("enableHTTPS"), ext.get("tlsConfig")


def test_dra_mtls_variant_is_the_dra_variant_over_mtls() -> None:
    dra = load_shipped(VARIANT)
    mtls = load_shipped(MTLS_VARIANT)
    both = load_shipped(DRA_MTLS / "scheduler-config-dra-mtls.yaml")
    assert _transport(both) == _transport(mtls)
    assert _transport(dra) == _transport(load_shipped())
    assert _transport(both)[0].startswith("https://") and _transport(dra)[0].startswith("http://")
    expected = copy.deepcopy(dra)
    (ext,) = expected["extenders"]
    ext["urlPrefix"], ext["enableHTTPS"], ext["tlsConfig"] = _transport(mtls)
    assert both == expected


def test_dra_component_patches_the_base_config_map() -> None:
    """A kustomize Component (an overlay with `resources: [../]` inside the base's folder does
    not build: kustomize reports a cycle); the buildable overlays list it."""
    kust = yaml.safe_load((VARIANT.parent / "kustomization.yaml").read_text())
    assert kust["kind"] == "Component" and "resources" not in kust
    assert {"path": VARIANT.name} in kust["patches"]
    for overlay, components in (
        ("dra", ["../../deploy/dra"]),
        ("dra-mtls", ["../../deploy/dra", "../../deploy/mtls"]),
    ):
        k = yaml.safe_load(
            (REPO / "config" / "overlays" / overlay / "kustomization.yaml").read_text()
        )
        assert (k["resources"], k["components"]) == (["../../deploy"], components), overlay
    both = yaml.safe_load((DRA_MTLS / "kustomization.yaml").read_text())
    # its own patch runs after the components, so its whole configuration wins
    assert both["patches"] == [{"path": "scheduler-config-dra-mtls.yaml"}]
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

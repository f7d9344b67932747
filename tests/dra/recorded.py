"""The DRA objects recorded from a real v1.33.0 control plane (tests/fixtures/kube/dra-1.33)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scheduler.core import dra

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "dra-1.33"
VERSIONS = ("v1beta1", "v1beta2")


def load(name: str) -> Any:
    """A recorded JSON file (fresh copy)."""
    return json.loads((DIR / name).read_text())


def items(name: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Items of a recorded list, with ``kind``/``apiVersion`` set as the reflector sets them."""
    lst = load(name)
    out = []
    for it in lst["items"]:
        if kind:
            it.setdefault("kind", kind)
        out.append(it)
    return out


def slices(version: str = "v1beta2") -> list[dict[str, Any]]:
    return items(f"resourceslices.{version}.json", "ResourceSlice")


def claims(version: str = "v1beta2") -> dict[str, dict[str, Any]]:
    return {dra.object_key(c): c for c in items(f"resourceclaims.{version}.json", "ResourceClaim")}


def classes(version: str = "v1beta2") -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in items(f"deviceclasses.{version}.json", "DeviceClass")}


def nodes() -> list[dict[str, Any]]:
    return items("nodes.json", "Node")


def pods() -> list[dict[str, Any]]:
    return items("pods.json", "Pod")


def extra(version: str = "v1beta2") -> dict[str, Any]:
    return {
        dra.SLICES_KEY: slices(version),
        dra.CLAIMS_KEY: claims(version),
        dra.CLASSES_KEY: classes(version),
    }


def watch_events() -> list[dict[str, Any]]:
    text = (DIR / "watch.resourceclaims.v1beta2.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---- v1.36.2 (tests/fixtures/kube/dra-1.36): resource.k8s.io/v1 only --------------------------

DIR_136 = Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "dra-1.36"


def load_136(name: str) -> Any:
    """A file recorded from the v1.36.2 control plane (fresh copy)."""
    return json.loads((DIR_136 / name).read_text())


def items_136(name: str, kind: str) -> list[dict[str, Any]]:
    """Items of a recorded 1.36 list, with ``kind`` set as the reflector sets it."""
    out = []
    for it in load_136(name)["items"]:
        it.setdefault("kind", kind)
        out.append(it)
    return out


def extra_136() -> dict[str, Any]:
    """``snapshot.extra`` of the recorded 1.36 objects (v1 slices, claims, classes)."""
    return {
        dra.SLICES_KEY: items_136("resourceslices.v1.json", "ResourceSlice"),
        dra.CLAIMS_KEY: {
            dra.object_key(c): c for c in items_136("resourceclaims.v1.json", "ResourceClaim")
        },
        dra.CLASSES_KEY: {
            c["metadata"]["name"]: c for c in items_136("deviceclasses.v1.json", "DeviceClass")
        },
    }

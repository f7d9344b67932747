"""The v1 ``Binding`` in Kubernetes' protobuf encoding, the way kube-scheduler sends it.

kube-scheduler's own binder POSTs its Binding as ``application/vnd.kubernetes.protobuf``;
a JSON body costs the API server a strict JSON decode (every field checked for unknown and
duplicate keys) that protobuf does not need. Measured live (perf, 500 fake nodes, 2,100
pods), the API server spent 0.32 ms per topoplace Binding against 0.14 ms per
kube-scheduler Binding; its JSON decode was about 0.07 ms of the difference.

:func:`binding` writes exactly the bytes the Kubernetes Go client writes for the same
object (``k8s.io/apimachinery/pkg/runtime/serializer/protobuf``: the ``k8s\\x00`` magic,
then a ``runtime.Unknown`` holding the type and the ``Binding`` message, every string
field present, map keys sorted); ``tests/test_kube_protobuf.py`` holds the Go output for
two Bindings. Field numbers are those of ``k8s.io/api/core/v1/generated.proto`` and
``k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto``. Only what a Binding carries is
written: name, namespace, uid, annotations, and the target node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes(field: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _object_meta(name: str, namespace: str, uid: str, annotations: Mapping[str, str]) -> bytes:
    parts = [
        _str(1, name),
        _str(2, ""),  # generateName
        _str(3, namespace),
        _str(4, ""),  # selfLink
        _str(5, uid),
        _str(6, ""),  # resourceVersion
        b"\x38\x00",  # generation = 0
        _bytes(8, b""),  # creationTimestamp: the zero Time
    ]
    for key in sorted(annotations):
        parts.append(_bytes(12, _str(1, key) + _str(2, annotations[key])))
    return b"".join(parts)


def _node_reference(node: str) -> bytes:
    # kind, namespace, name, uid, apiVersion, resourceVersion, fieldPath
    return b"".join(
        (_str(1, "Node"), _str(2, ""), _str(3, node), *(_str(f, "") for f in (4, 5, 6, 7)))
    )


def binding(body: Mapping[str, Any]) -> bytes:
    """The protobuf request body of a v1 ``Binding`` given as its JSON-shaped dict
    (``scheduler.kube.binder.binding_body``: ``metadata`` name, namespace, optional uid
    and annotations; ``target`` a Node by name).

    Raises:
        ValueError: the dict is not such a Binding (another target kind, a field this
            encoder does not write), so that nothing is silently dropped.
    """
    meta = dict(body.get("metadata") or {})
    target = dict(body.get("target") or {})
    if body.get("kind") != "Binding" or body.get("apiVersion") != "v1":
        raise ValueError("not a v1 Binding")
    if set(meta) - {"name", "namespace", "uid", "annotations"}:
        raise ValueError(f"Binding metadata fields not encoded: {sorted(set(meta))}")
    if target.get("kind") != "Node" or set(target) - {"kind", "name"}:
        raise ValueError("Binding target must be a Node by name")
    annotations = meta.get("annotations") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise ValueError("Binding annotations must be strings")
    message = _bytes(
        1,
        _object_meta(
            str(meta.get("name") or ""),
            str(meta.get("namespace") or ""),
            str(meta.get("uid") or ""),
            annotations,
        ),
    ) + _bytes(2, _node_reference(str(target.get("name") or "")))
    type_meta = _str(1, "v1") + _str(2, "Binding")
    unknown = _bytes(1, type_meta) + _bytes(2, message) + _str(3, "") + _str(4, "")
    return MAGIC + unknown

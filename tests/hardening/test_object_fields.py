"""Issue 12, finding 7 (the object-parsing part): any malformed field of a Pod topoplace is
asked to place is an ObjectError with a clear message, never another exception.

Before the fix ``metadata.labels`` as a list raised AttributeError (``'list' object has no
attribute 'get'``), which the HTTP edge answered with "internal error".
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scheduler.core.objects import ObjectError, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.builders import gang_pod, make_node, make_pod
from tests.hardening.objects import deep, set_path
from tests.helpers import asgi_client

FABRIC = SchedParams().fabric
BASE = gang_pod("w-0", 4, "train", 4)

ROWS: list[tuple[str, Any, str]] = [
    ("metadata.labels", ["a", "b"], "metadata.labels must be an object"),
    ("metadata.labels", "app=x", "metadata.labels must be an object"),
    ("metadata.labels.app", 5, "metadata.labels must map strings to strings"),
    ("metadata.labels.app", deep(5000), "metadata.labels must map strings to strings"),
    ("metadata.annotations", [["k", "v"]], "metadata.annotations must be an object"),
    ("metadata.annotations.[topoplace.io/gang]", {"a": 1}, "must map strings to strings"),
    ("metadata.annotations.[topoplace.io/min-link]", 3, "must map strings to strings"),
    ("metadata.annotations.[topoplace.io/min-link]", "x" * 100_000, "unknown link class"),
    ("metadata.annotations.[topoplace.io/topology-required]", "rack", "unknown topology level"),
    ("metadata", ["name", "w-0"], "metadata must be an object"),
    ("metadata.name", {"n": 1}, "metadata.name must be a string"),
    ("metadata.namespace", 7, "metadata.namespace must be a string"),
    ("metadata.uid", deep(3000), "metadata.uid must be a string"),
    ("spec", "none", "spec must be an object"),
    ("spec.containers", {"name": "main"}, "spec.containers must be a list"),
    ("spec.containers.0", "main", "spec.containers entries must be objects"),
    ("spec.initContainers", 1, "spec.initContainers must be a list"),
    ("spec.containers.0.resources", ["cpu"], "resources must be an object"),
    ("spec.containers.0.resources.requests", "1", "resources.requests must be an object"),
    ("spec.containers.0.resources.limits", 1.5, "resources.limits must be an object"),
    ("spec.nodeSelector", ["a=b"], "spec.nodeSelector must be an object"),
    ("spec.nodeSelector.zone", None, "spec.nodeSelector must map strings to strings"),
    ("spec.priority", "urgent", "spec.priority: not a number"),
    ("spec.priority", deep(100), "spec.priority: not a number"),
]


@pytest.mark.parametrize(
    ("path", "value", "match"), ROWS, ids=[f"{p}={type(v).__name__}" for p, v, _ in ROWS]
)
def test_malformed_pod_fields_are_object_errors(path: str, value: Any, match: str) -> None:
    pod = set_path(BASE, path, value)
    with pytest.raises(ObjectError, match=match):
        request_from_pod(pod, FABRIC)


@pytest.mark.parametrize("pod", [[], "pod", 3, None], ids=["list", "str", "int", "None"])
def test_a_pod_that_is_not_an_object_is_an_object_error(pod: Any) -> None:
    with pytest.raises(ObjectError, match="pod must be an object"):
        request_from_pod(pod, FABRIC)


def test_absent_fields_are_still_fine() -> None:
    pod = set_path(BASE, "metadata.labels", None)
    pod = set_path(pod, "spec.initContainers", None)
    assert request_from_pod(pod, FABRIC).gang == "default/train"
    bare = {"metadata": {"name": "x"}}
    r = request_from_pod(bare, FABRIC)
    assert (r.key, r.gpus, r.gang) == ("default/x", 0, "")


def test_the_extender_answers_malformed_pods_with_a_reason() -> None:
    """Through the HTTP edge: the filter's Error names the field instead of "internal error";
    prioritize scores 0; bind refuses with the reason."""
    ext = Extender(ClusterCache.from_objects([make_node("n", 8)], [], SchedParams()))
    c = asgi_client(ext)
    pod = make_pod("a", 2)
    pod["metadata"]["labels"] = ["team", "ml"]
    args = orjson.dumps({"Pod": pod, "NodeNames": ["n"]})
    body = c.post("/scheduler/filter", content=args).json()
    assert body["Error"] == "invalid pod: metadata.labels must be an object"
    scores = c.post("/scheduler/prioritize", content=args).json()
    assert scores == [{"Host": "n", "Score": 0}]

"""The protobuf Binding (``scheduler/kube/protobuf.py``) against the bytes the Kubernetes Go
client writes, and the event-loop bind sending it.

The two expected byte strings were produced by the Kubernetes v1.33.0 Go packages
(``k8s.io/apimachinery/pkg/runtime/serializer/protobuf.NewSerializer(scheme.Scheme,
scheme.Scheme).Encode`` of a ``v1.Binding`` with the same fields, built from the source
tree in this session): the serializer kube-scheduler's client uses. The live suite
(tests/kube) binds through the real API server with it.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from scheduler.kube import binder as kb
from scheduler.kube import protobuf
from tests.kube.recorded import RecordedApiServer

WHY = (
    "dgx-h100-01 score 10 = topology 4.00 + health 2.00 + packing 4.00; runner-up "
    "dgx-h100-04 (7): lost on packing"
)
GANG_BINDING = {
    "kind": "Binding",
    "apiVersion": "v1",
    "metadata": {
        "name": "train-0",
        "namespace": "ml",
        "uid": "3f2a9c1e-5b7d-4e21-9a0c-6d8e1f2b3c4d",
        "annotations": {
            "topoplace.io/placement": '{"gpus":[0,1,2,3],"node":"dgx-h100-01","v":1,"why":"'
            + WHY
            + '"}',
            "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,6000,30:;",
        },
    },
    "target": {"kind": "Node", "name": "dgx-h100-01"},
}
GO_GANG_BINDING = (
    "6b3873000a0d0a027631120742696e64696e6712dc020aba020a07747261696e2d3012001a026d6c2200"
    "2a2433663261396331652d356237642d346532312d396130632d366438653166326233633464320038"
    "004200623a0a2068616d692e696f2f766770752d646576696365732d746f2d616c6c6f636174651216"
    "4750552d302c4e56494449412c363030302c33303a3b62be010a16746f706f706c6163652e696f2f70"
    "6c6163656d656e7412a3017b2267707573223a5b302c312c322c335d2c226e6f6465223a226467782d"
    "683130302d3031222c2276223a312c22776879223a226467782d683130302d30312073636f72652031"
    "30203d20746f706f6c6f677920342e3030202b206865616c746820322e3030202b207061636b696e67"
    "20342e30303b2072756e6e65722d7570206467782d683130302d3034202837293a206c6f7374206f6e"
    "207061636b696e67227d121d0a044e6f646512001a0b6467782d683130302d303122002a0032003a00"
    "1a002200"
)
PLAIN_BINDING = {
    "kind": "Binding",
    "apiVersion": "v1",
    "metadata": {"name": "p", "namespace": "default"},
    "target": {"kind": "Node", "name": "n"},
}
GO_PLAIN_BINDING = (
    "6b3873000a0d0a027631120742696e64696e67122f0a180a017012001a0764656661756c7422002a00"
    "32003800420012130a044e6f646512001a016e22002a0032003a001a002200"
)


@pytest.mark.parametrize(
    ("body", "go"),
    [(GANG_BINDING, GO_GANG_BINDING), (PLAIN_BINDING, GO_PLAIN_BINDING)],
)
def test_binding_is_byte_for_byte_what_the_go_client_writes(body: dict, go: str) -> None:
    assert protobuf.binding(body).hex() == go


def test_annotation_order_does_not_matter_and_long_values_take_multibyte_lengths() -> None:
    a = dict(GANG_BINDING, metadata=dict(GANG_BINDING["metadata"]))
    a["metadata"]["annotations"] = dict(
        reversed(list(GANG_BINDING["metadata"]["annotations"].items()))
    )
    assert protobuf.binding(a) == protobuf.binding(GANG_BINDING)
    long = dict(
        PLAIN_BINDING,
        metadata={"name": "p", "namespace": "default", "annotations": {"k": "x" * 20000}},
    )
    raw = protobuf.binding(long)
    assert b"x" * 20000 in raw and len(raw) > 20000
    # 20000 = 0xa0 0x9c 0x01 as a varint, right before the value.
    assert b"\x12\xa0\x9c\x01" + b"x" * 10 in raw


@pytest.mark.parametrize(
    "bad",
    [
        dict(PLAIN_BINDING, kind="Pod"),
        dict(PLAIN_BINDING, target={"kind": "Pod", "name": "n"}),
        dict(PLAIN_BINDING, metadata={"name": "p", "labels": {"a": "b"}}),
        dict(PLAIN_BINDING, metadata={"name": "p", "annotations": {"a": 1}}),
    ],
)
def test_what_it_cannot_encode_is_refused_not_dropped(bad: dict) -> None:
    with pytest.raises(ValueError):
        protobuf.binding(bad)


def test_the_event_loop_bind_posts_protobuf_and_reads_json() -> None:
    pod = {
        "metadata": {"name": "train-a", "namespace": "rec", "uid": "u-1"},
        "spec": {"containers": []},
    }
    with RecordedApiServer() as srv:
        srv.add(
            "POST", "/api/v1/namespaces/rec/pods/train-a/binding", 201, "binding_201_created.json"
        )
        binder = kb.KubeBinder(srv.api())
        ann = {"topoplace.io/placement": '{"gpus":[0],"node":"rec-node-0","v":1}'}
        assert asyncio.run(binder.bind_async(pod, "rec-node-0", ann)) == ""
        assert binder.bind(pod, "rec-node-0", ann) == ""
    (loop_req, thread_req) = srv.requests
    assert loop_req["content_type"] == protobuf.CONTENT_TYPE
    assert loop_req["accept"] == "application/json"
    assert loop_req["body"] == protobuf.binding(kb.binding_body(pod, "rec-node-0", ann))
    # The thread path (urllib3, a fallback) keeps JSON: the same Binding.
    assert thread_req["content_type"] == "application/json"
    assert orjson.loads(thread_req["body"]) == kb.binding_body(pod, "rec-node-0", ann)

"""klet.cri.containerevents' decoding: containerd task envelopes and CRI container events.

Covers: the subscription filters ask for the four task topics of the CRI namespace;
a TaskExit of a container's init process becomes an EXITED event with its exit status
and exit time; start, OOM and delete topics map to their kinds; an exec's exit or
delete, another namespace, another topic, a payload of another type, an undecodable
payload and an event without a container ID are dropped; a CRI ContainerEventResponse
maps its type and carries the pod UID from the sandbox status.
"""

from __future__ import annotations

import pytest
from cri_api.v1 import api_pb2 as cri_pb
from google.protobuf import any_pb2, timestamp_pb2
from klet.cri import labels as L
from klet.cri.containerevents import decode_cri_event, decode_envelope, subscribe_filters
from klet.cri.types import EventKind
from klet.rpc.gen.klet.containerd.v1 import events_pb2, task_pb2


def envelope(topic: str, payload: object, *, namespace: str = "k8s.io") -> events_pb2.Envelope:
    name = payload.DESCRIPTOR.full_name  # type: ignore[attr-defined]
    return events_pb2.Envelope(
        timestamp=timestamp_pb2.Timestamp(seconds=100, nanos=500_000_000),
        namespace=namespace,
        topic=topic,
        event=any_pb2.Any(type_url=name, value=payload.SerializeToString()),  # type: ignore[attr-defined]
    )


def test_filters_name_each_task_topic_in_the_namespace() -> None:
    assert subscribe_filters("k8s.io") == [
        'namespace=="k8s.io",topic=="/tasks/start"',
        'namespace=="k8s.io",topic=="/tasks/exit"',
        'namespace=="k8s.io",topic=="/tasks/oom"',
        'namespace=="k8s.io",topic=="/tasks/delete"',
    ]


def test_an_init_exit_decodes_with_status_and_time() -> None:
    exit_ = task_pb2.TaskExit(
        container_id="c1",
        id="c1",
        pid=42,
        exit_status=137,
        exited_at=timestamp_pb2.Timestamp(seconds=99, nanos=250_000_000),
    )
    event = decode_envelope(envelope("/tasks/exit", exit_))
    assert event is not None
    assert (event.kind, event.object_id, event.exit_status) == (EventKind.EXITED, "c1", 137)
    assert event.at == pytest.approx(99.25) and event.pod_uid == ""
    # some shims leave `id` empty for the init process
    exit_.id = ""
    assert decode_envelope(envelope("/tasks/exit", exit_)) is not None


@pytest.mark.parametrize(
    ("topic", "payload", "kind"),
    [
        ("/tasks/start", task_pb2.TaskStart(container_id="c1", pid=7), EventKind.STARTED),
        ("/tasks/oom", task_pb2.TaskOOM(container_id="c1"), EventKind.OOM),
        ("/tasks/delete", task_pb2.TaskDelete(container_id="c1", pid=7), EventKind.DELETED),
    ],
)
def test_other_topics_map_to_their_kinds(topic: str, payload: object, kind: EventKind) -> None:
    event = decode_envelope(envelope(topic, payload))
    assert event is not None and event.kind is kind and event.object_id == "c1"
    assert event.at == pytest.approx(100.5)  # the envelope's time


def test_what_is_dropped() -> None:
    exec_exit = task_pb2.TaskExit(container_id="c1", id="exec-1", exit_status=0)
    assert decode_envelope(envelope("/tasks/exit", exec_exit)) is None
    exec_delete = task_pb2.TaskDelete(container_id="c1", id="exec-1")
    assert decode_envelope(envelope("/tasks/delete", exec_delete)) is None
    start = task_pb2.TaskStart(container_id="c1")
    assert decode_envelope(envelope("/tasks/start", start, namespace="moby")) is None
    assert decode_envelope(envelope("/tasks/paused", start)) is None
    assert decode_envelope(envelope("/tasks/exit", start)) is None  # a TaskStart payload
    assert decode_envelope(envelope("/tasks/start", task_pb2.TaskStart())) is None
    garbage = envelope("/tasks/start", start)
    garbage.event.value = b"\xff\xff\xff"
    assert decode_envelope(garbage) is None


def test_a_cri_event_carries_its_pod() -> None:
    r = cri_pb.ContainerEventResponse(
        container_id="c1",
        container_event_type=cri_pb.ContainerEventType.CONTAINER_STOPPED_EVENT,
        created_at=2_000_000_000,
        pod_sandbox_status=cri_pb.PodSandboxStatus(
            id="s1",
            metadata=cri_pb.PodSandboxMetadata(uid="meta-uid"),
            labels={L.POD_UID: "u1"},
        ),
    )
    event = decode_cri_event(r)
    assert event is not None
    assert (event.kind, event.object_id, event.pod_uid, event.at) == (
        EventKind.EXITED,
        "c1",
        "u1",
        2.0,
    )
    r.pod_sandbox_status.labels.clear()
    assert decode_cri_event(r).pod_uid == "meta-uid"  # type: ignore[union-attr]
    r.ClearField("pod_sandbox_status")
    assert decode_cri_event(r).pod_uid == ""  # type: ignore[union-attr]
    r.container_id = ""
    assert decode_cri_event(r) is None

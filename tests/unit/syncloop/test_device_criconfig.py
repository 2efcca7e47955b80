"""What a container's devices add to its CRI config (criconfig.Instance.allocated): the
plugins' envs before the container's own (which win on a clash, as upstream's order
does), their mounts and device nodes after the volumes', their annotations beside
klet's, and the CDI devices; and on the wire (CRI CDI_devices)."""

from __future__ import annotations

from klet.cri.client import _container_pb
from klet.cri.types import Device, Mount
from klet.syncloop.containers import criconfig
from klet.syncloop.devices.allocation import DeviceMount, DeviceNode, DeviceRunOptions

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
CONTAINER = {"name": "main", "env": [{"name": "SHARED", "value": "container"}]}
ALLOCATED = DeviceRunOptions(
    envs=(("FOO_DEVICES", "d1"), ("SHARED", "device")),
    mounts=(DeviceMount("/var/foo/d1", "/host/files/d1", read_only=True),),
    devices=(DeviceNode("/dev/foo1", "/host/nodes/d1", "rw"),),
    annotations=(("example.com/foo-devices", "d1"),),
    cdi_devices=("example.com/foo=d1",),
)


def test_allocate_answer_in_the_container_config() -> None:
    volume = Mount(container_path="/data", host_path="/v")
    cfg = criconfig.container_config(
        POD,
        CONTAINER,
        instance=criconfig.Instance(
            restart_count=0, image="sha256:img", mounts=(volume,), allocated=ALLOCATED
        ),
        node=criconfig.NodeContext(),
    )
    envs = list(cfg.envs)
    assert envs.index(("FOO_DEVICES", "d1")) < envs.index(("SHARED", "container"))
    assert [v for k, v in envs if k == "SHARED"][-1] == "container"  # the last one counts
    assert cfg.mounts == (volume, Mount("/var/foo/d1", "/host/files/d1", readonly=True))
    assert cfg.devices == (Device("/dev/foo1", "/host/nodes/d1", "rw"),)
    assert cfg.annotations["example.com/foo-devices"] == "d1"
    assert cfg.cdi_devices == ("example.com/foo=d1",)
    wire = _container_pb(cfg)
    assert [d.name for d in wire.CDI_devices] == ["example.com/foo=d1"]


def test_no_devices_no_change() -> None:
    plain = criconfig.container_config(
        POD,
        CONTAINER,
        instance=criconfig.Instance(restart_count=0, image="sha256:img"),
        node=criconfig.NodeContext(),
    )
    assert plain.cdi_devices == () and plain.devices == () and plain.mounts == ()
    assert list(plain.envs) == [("SHARED", "container")]

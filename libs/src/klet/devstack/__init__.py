"""Private instances of the real components klet runs against: `klet up`'s stack.

``klet up`` and the integration-test harness both use this package to start Redis, a
local OCI registry holding test images built from busybox-static, and containerd with a
bridge CNI network, each under a private directory with private sockets and free
loopback ports, so a run never touches a system instance. See ``DevStack``. What only
the tests start (a test PKI, a control plane, dockerd) is `klet.testbed`, a distribution
of its own that the images do not ship.

The names below load their module on first use (PEP 562): `klet up` with a runtime
endpoint of its own needs only `RedisServer`, and importing the image builder's HTTP
client and the rest with it cost that supervisor process about 10 MB resident.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klet.devstack.cni import CniNetwork, choose_subnet, claim_subnet, release_subnet
    from klet.devstack.containerd import Containerd, ContainerdError
    from klet.devstack.images import (
        BUSYBOX_IMAGE,
        HTTPD_IMAGE,
        PAUSE_IMAGE,
        TEST_REGISTRY_HOST,
        BuiltImage,
        Busybox,
        ImageError,
        ImageSpec,
        build,
        oci_archive_bytes,
        push,
        standard_images,
        write_oci_archive,
    )
    from klet.devstack.procs import ManagedProcess, Pidfile, StartError, free_port
    from klet.devstack.redis_server import RedisServer, RedisTLS
    from klet.devstack.registry import Registry
    from klet.devstack.stack import DevStack

_MODULE_OF = {
    "CniNetwork": "cni",
    "choose_subnet": "cni",
    "claim_subnet": "cni",
    "release_subnet": "cni",
    "Containerd": "containerd",
    "ContainerdError": "containerd",
    "BUSYBOX_IMAGE": "images",
    "HTTPD_IMAGE": "images",
    "PAUSE_IMAGE": "images",
    "TEST_REGISTRY_HOST": "images",
    "BuiltImage": "images",
    "Busybox": "images",
    "ImageError": "images",
    "ImageSpec": "images",
    "build": "images",
    "oci_archive_bytes": "images",
    "push": "images",
    "standard_images": "images",
    "write_oci_archive": "images",
    "ManagedProcess": "procs",
    "Pidfile": "procs",
    "StartError": "procs",
    "free_port": "procs",
    "RedisServer": "redis_server",
    "RedisTLS": "redis_server",
    "Registry": "registry",
    "DevStack": "stack",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BUSYBOX_IMAGE",
    "HTTPD_IMAGE",
    "PAUSE_IMAGE",
    "TEST_REGISTRY_HOST",
    "BuiltImage",
    "Busybox",
    "CniNetwork",
    "Containerd",
    "ContainerdError",
    "DevStack",
    "ImageError",
    "ImageSpec",
    "ManagedProcess",
    "Pidfile",
    "RedisServer",
    "RedisTLS",
    "Registry",
    "StartError",
    "build",
    "choose_subnet",
    "claim_subnet",
    "free_port",
    "oci_archive_bytes",
    "push",
    "release_subnet",
    "standard_images",
    "write_oci_archive",
]

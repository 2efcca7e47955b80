"""Private instances of the real components klet runs against, for dev and tests.

``klet up`` and the integration-test harness both use this package to start Redis, a
local OCI registry holding test images built from busybox-static, and containerd with a
bridge CNI network, each under a private directory with private sockets and free
loopback ports, so a run never touches a system instance. See ``DevStack``.
"""

from klet.devstack.cni import CniNetwork, choose_subnet, claim_subnet, release_subnet
from klet.devstack.containerd import Containerd, ContainerdError
from klet.devstack.dockerd import Dockerd
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
    "Dockerd",
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

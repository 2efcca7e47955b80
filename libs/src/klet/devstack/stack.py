"""The whole private dev stack: Redis, a registry with the test images, containerd.

``klet up`` and the integration tests both start exactly this, so what a developer runs
by hand is what CI runs. Components live in sub-directories of one directory (keep it
short, e.g. ``/tmp/klet-xxxx``: containerd's socket path must fit in 107 bytes); the
registry listens on a free loopback port, Redis on a root-only unix socket with a user
per service of each node (``redis.service_flags(node, service)``). Start order follows
the dependencies (the registry must hold the images before containerd is told about
it; containerd must have the pause image before any sandbox); stop runs in reverse and
tolerates a partial start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from klet.devstack.containerd import Containerd
from klet.devstack.images import (
    PAUSE_IMAGE,
    BuiltImage,
    ImageSpec,
    build,
    push,
    standard_images,
    write_oci_archive,
)
from klet.devstack.redis_server import RedisServer
from klet.devstack.registry import Registry
from klet.model.layout import REDIS_DIR

log = logging.getLogger(__name__)


class DevStack:
    """Redis + registry (+ containerd) under ``dir``, started and stopped together."""

    def __init__(
        self,
        dir: Path,
        *,
        start_containerd: bool = True,
        images: Mapping[str, ImageSpec] | None = None,
        containerd_root_size: int | None = None,
        systemd_cgroup: bool = False,
        containerd_binary: str | None = None,
        cdi_spec_dirs: tuple[Path, ...] | None = None,
    ) -> None:
        """``containerd_binary`` with ``cdi_spec_dirs``: run that containerd v2 (built by
        tools/dra/build-containerd.sh) with CDI on, reading specs from those directories,
        instead of Debian's 1.6, which has no CDI (the DRA conformance run's node).
        ``containerd_root_size``: bytes of a tmpfs for containerd's root (a small image
        filesystem for image GC tests); None keeps it on the host's disk. ``systemd_cgroup``:
        containerd's runc puts containers in systemd scopes (``cgroupDriver: systemd``)."""
        self.dir = dir.resolve()
        self.start_containerd = start_containerd
        self.specs = dict(images if images is not None else standard_images())
        self.redis = RedisServer(self.dir / REDIS_DIR)
        self.registry = Registry(self.dir / "registry")
        self.containerd: Containerd | None = (
            Containerd.for_registry(
                self.dir / "containerd",
                self.registry.address,
                sandbox_image=PAUSE_IMAGE,
                root_size_bytes=containerd_root_size,
                systemd_cgroup=systemd_cgroup,
                cdi_spec_dirs=cdi_spec_dirs,
                binary=containerd_binary,
            )
            if start_containerd
            else None
        )
        self.images: dict[str, BuiltImage] = {}
        self.start_seconds: float | None = None

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def registry_address(self) -> str:
        return self.registry.address

    @property
    def runtime_endpoint(self) -> str:
        if self.containerd is None:
            raise RuntimeError("this DevStack was created with start_containerd=False")
        return self.containerd.endpoint

    def start(self) -> None:
        began = time.monotonic()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.redis.start()
            self.registry.start()
            for key, spec in self.specs.items():
                self.add_image(spec, key=key)
            if self.containerd is not None:
                self.containerd.start()
                self._import_sandbox_image(self.containerd)
        except BaseException:
            try:
                self.stop()
            except Exception:
                log.exception("clean-up after a failed start failed")
            raise
        self.start_seconds = time.monotonic() - began
        log.info(
            "dev stack started dir=%s seconds=%.2f redis=%s registry=%s runtime=%s",
            self.dir,
            self.start_seconds,
            self.redis_url,
            self.registry_address,
            self.containerd.endpoint if self.containerd else "-",
        )

    def add_image(self, spec: ImageSpec, *, key: str | None = None) -> BuiltImage:
        """Build ``spec`` and push it to the registry (a no-op if already there)."""
        img = build(spec)
        push(img, self.registry.address)
        self.images[key or spec.repository] = img
        return img

    def extra_containerd(self, dir: Path, *, socket_dir: Path | None = None) -> Containerd:
        """Start another containerd under ``dir``, beside the stack's own: its own root,
        state, sockets and CNI network (a subnet of its own, see ``claim_subnet``),
        pulling from this stack's registry, with the pause image imported. For a second
        klet node, which must never share a runtime with another; the caller stops it."""
        containerd = Containerd.for_registry(
            dir, self.registry.address, sandbox_image=PAUSE_IMAGE, socket_dir=socket_dir
        )
        containerd.start()
        try:
            self._import_sandbox_image(containerd)
        except BaseException:
            containerd.stop()
            raise
        return containerd

    def _import_sandbox_image(self, containerd: Containerd) -> None:
        # Imported rather than pulled so a sandbox never depends on the registry being up
        # (tests stop the registry to check image-pull failures).
        pause = next(
            (img for img in self.images.values() if img.reference == containerd.sandbox_image), None
        )
        if pause is None:
            pause = build(
                next(
                    s for s in standard_images().values() if s.reference == containerd.sandbox_image
                )
            )
        archive = self.dir / "pause.oci.tar"
        write_oci_archive(pause, archive)
        containerd.import_image(archive)

    def stop(self) -> None:
        """Stop in reverse order; every component is attempted even if one fails."""
        errors: list[BaseException] = []
        for name, stop in (
            ("containerd", self.containerd.stop if self.containerd else None),
            ("registry", self.registry.stop),
            ("redis", self.redis.stop),
        ):
            if stop is None:
                continue
            try:
                stop()
            except Exception as exc:
                log.exception("stopping %s failed", name)
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> DevStack:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

"""`make image`: build `klet:<version>` and `klet-redis:<version>` as OCI archives
(and, when asked for, `klet-systemd-node:<version>`, the systemd tier's test node).

No Docker daemon and no Dockerfile: the layers come from mmdebstrap and uv (see
tools/image/layers.py), the config, manifest and archive from tools/image/oci.py. Each
archive is an OCI layout that `ctr images import`, `skopeo copy oci-archive:` and
docker 20.10's `docker load` all accept.

    python -m tools.image [--out-dir DIR] [--cache-dir DIR] [--uv PATH] [IMAGE ...]

IMAGE is klet, redis (the default: both) or systemd-node.

The last lines printed are one per image: name, archive path, sizes and seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tools.image.layers import (
    ROOT,
    BuildError,
    LayerCache,
    Rootfs,
    dependencies_layer,
    rootfs_layer,
    workspace_layer,
)
from tools.image.oci import (
    ImageConfig,
    Layer,
    compress_layer,
    image_config,
    tar_dir_chunks,
    write_archive,
)

# What the services execute or load besides Python: mount/umount (syncloop's volumes,
# package mount), util-linux (nsenter, findmnt for diagnosis in the container),
# iproute2 (ip, for a look at the host network the services run in), ca-certificates
# (TLS to the apiserver and manifest URLs).
KLET_ROOTFS = Rootfs(
    name="klet", packages=("python3", "util-linux", "iproute2", "ca-certificates", "mount")
)
REDIS_ROOTFS = Rootfs(name="redis", packages=("redis-server",))
# A test node whose PID 1 is systemd (the systemd cgroup driver and graceful shutdown
# need a real systemd and logind; the hosts here have none): Debian's systemd and dbus,
# the container runtime and CNI plugins the dev stack uses (containerd, runc,
# containernetworking-plugins, iptables for portmap), and what `klet up`'s private
# stack runs besides (redis-server, docker-registry, busybox-static for the test
# images), socat (the tests relay the apiserver into the node over a Unix socket), with
# the klet workspace on top as in the klet image.
SYSTEMD_NODE_ROOTFS = Rootfs(
    name="systemd-node",
    packages=(
        "python3",
        "systemd",
        "systemd-sysv",
        "dbus",
        "containerd",
        "runc",
        "containernetworking-plugins",
        "iptables",
        "redis-server",
        "docker-registry",
        "apache2-utils",
        "busybox-static",
        "util-linux",
        "iproute2",
        "mount",
        "ca-certificates",
        "procps",
        "socat",
    ),
)
# The packages' own daemons stay off: `klet up` runs a private containerd, registry and
# Redis of its own (a second containerd would hold /var/lib/containerd for nothing), and
# a container has no consoles or udev to serve.
SYSTEMD_NODE_MASKED = (
    "containerd.service",
    "docker-registry.service",
    "redis-server.service",
    "getty@tty1.service",
    "console-getty.service",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
)
# The Redis image runs as this user and group, not root and without a passwd entry
# (Redis needs none). docker-compose.yml and the chart name the same numbers: the bus
# files Redis reads are given to its group, and the services join that group to reach its
# socket (mode 0660).
REDIS_UID = 6379
REDIS_GID = 6379
SCRIPTS_DIR = Path(__file__).parent / "redis"
REDIS_SCRIPTS = ("klet-redis-server", "klet-redis-check")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Built:
    reference: str
    archive: Path
    layers: list[Layer]
    seconds: float

    @property
    def compressed(self) -> int:
        return sum(layer.size for layer in self.layers)

    @property
    def uncompressed(self) -> int:
        return sum(layer.uncompressed_size for layer in self.layers)

    def summary(self) -> str:
        return (
            f"{self.reference} {self.archive} layers={len(self.layers)} "
            f"compressed={self.compressed / 1e6:.1f}MB "
            f"uncompressed={self.uncompressed / 1e6:.1f}MB seconds={self.seconds:.1f}"
        )


def version() -> str:
    return str(tomllib.loads((ROOT / "libs/pyproject.toml").read_text())["project"]["version"])


def labels(title: str) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.version": version(),
        "org.opencontainers.image.base.name": "debian:bookworm",
    }


def build_klet(*, out_dir: Path, cache: LayerCache, uv: Path) -> Built:
    began = time.monotonic()
    reference = f"klet:{version()}"
    rootfs = rootfs_layer(KLET_ROOTFS, cache)
    python = rootfs.python_version()
    deps = dependencies_layer(uv=uv, python_version=python, cache=cache)
    with tempfile.TemporaryDirectory(prefix="klet-image-") as tmp:
        workspace = workspace_layer(uv=uv, python_version=python, dest=Path(tmp) / "ws.tar.gz")
        layers = [rootfs.layer, deps, workspace]
        config = image_config(
            layers,
            ImageConfig(
                entrypoint=["klet"],
                cmd=["--help"],
                # The .pyc files are built in; a container never writes new ones. Two
                # glibc malloc arenas per process, not one per thread (as `klet up` sets
                # for its services): about 3 MB less resident over the five services.
                env={"PATH": PATH, "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "2"},
                labels=labels("klet"),
            ),
            history=[
                _rootfs_step(KLET_ROOTFS),
                "uv pip install (uv.lock, third-party)",
                "uv pip install (workspace wheels)",
            ],
        )
        archive = out_dir / f"klet-{version()}.oci.tar"
        write_archive(archive, reference=reference, layers=layers, config=config)
    return Built(reference, archive, layers, time.monotonic() - began)


def build_systemd_node(*, out_dir: Path, cache: LayerCache, uv: Path) -> Built:
    """`klet-systemd-node:<version>`: systemd as PID 1 with klet installed (see
    SYSTEMD_NODE_ROOTFS); tests/systemd runs it on a private dockerd with every
    capability of the host (tests/harness/systemd_node.py)."""
    began = time.monotonic()
    reference = f"klet-systemd-node:{version()}"
    rootfs = rootfs_layer(SYSTEMD_NODE_ROOTFS, cache)
    python = rootfs.python_version()
    deps = dependencies_layer(uv=uv, python_version=python, cache=cache)
    with tempfile.TemporaryDirectory(prefix="klet-image-") as tmp:
        workspace = workspace_layer(uv=uv, python_version=python, dest=Path(tmp) / "ws.tar.gz")
        units = masked_units_layer(Path(tmp) / "units.tar.gz", SYSTEMD_NODE_MASKED)
        layers = [rootfs.layer, deps, workspace, units]
        config = image_config(
            layers,
            ImageConfig(
                entrypoint=["/sbin/init"],
                cmd=[],
                env={"PATH": PATH, "container": "docker"},
                labels=labels("klet-systemd-node"),
                # systemd's "halt" signal: `docker stop` powers the node off cleanly.
                stop_signal="SIGRTMIN+3",
            ),
            history=[
                _rootfs_step(SYSTEMD_NODE_ROOTFS),
                "uv pip install (uv.lock, third-party)",
                "uv pip install (workspace wheels)",
                f"systemctl mask {' '.join(SYSTEMD_NODE_MASKED)}",
            ],
        )
        archive = out_dir / f"klet-systemd-node-{version()}.oci.tar"
        write_archive(archive, reference=reference, layers=layers, config=config)
    return Built(reference, archive, layers, time.monotonic() - began)


def masked_units_layer(dest: Path, units: tuple[str, ...]) -> Layer:
    """`systemctl mask` of `units`: a link to /dev/null in /etc/systemd/system for each."""
    with tempfile.TemporaryDirectory(prefix="klet-units-") as tmp:
        stage = Path(tmp)
        unit_dir = stage / "etc/systemd/system"
        unit_dir.mkdir(parents=True)
        for d in (stage / "etc", stage / "etc/systemd", unit_dir):
            d.chmod(0o755)
        for unit in units:
            (unit_dir / unit).symlink_to("/dev/null")
        return compress_layer(tar_dir_chunks(stage), dest)


def build_redis(*, out_dir: Path, cache: LayerCache) -> Built:
    began = time.monotonic()
    reference = f"klet-redis:{version()}"
    rootfs = rootfs_layer(REDIS_ROOTFS, cache)
    with tempfile.TemporaryDirectory(prefix="klet-image-") as tmp:
        scripts = redis_scripts_layer(Path(tmp) / "scripts.tar.gz")
        layers = [rootfs.layer, scripts]
        config = image_config(
            layers,
            ImageConfig(
                # redis-server, then klet's function library loaded as the admin (the
                # bundled Redis keeps nothing across a restart); klet-redis-check is the
                # health check that fails until the library is loaded.
                entrypoint=["klet-redis-server"],
                cmd=[],
                env={"PATH": PATH},
                labels=labels("klet-redis"),
                user=f"{REDIS_UID}:{REDIS_GID}",
            ),
            history=[
                _rootfs_step(REDIS_ROOTFS),
                f"COPY {' '.join(REDIS_SCRIPTS)} /usr/local/bin/",
            ],
        )
        archive = out_dir / f"klet-redis-{version()}.oci.tar"
        write_archive(archive, reference=reference, layers=layers, config=config)
    return Built(reference, archive, layers, time.monotonic() - began)


def redis_scripts_layer(dest: Path) -> Layer:
    """tools/image/redis/* in /usr/local/bin, mode 0755."""
    with tempfile.TemporaryDirectory(prefix="klet-redis-scripts-") as tmp:
        stage = Path(tmp)
        bin_dir = stage / "usr/local/bin"
        bin_dir.mkdir(parents=True)
        for d in (stage / "usr", stage / "usr/local", bin_dir):
            d.chmod(0o755)
        for name in REDIS_SCRIPTS:
            target = bin_dir / name
            shutil.copyfile(SCRIPTS_DIR / name, target)
            target.chmod(0o755)
        return compress_layer(tar_dir_chunks(stage), dest)


def _rootfs_step(spec: Rootfs) -> str:
    return f"mmdebstrap --variant=minbase --include={','.join(sorted(spec.packages))} bookworm"


def default_uv() -> Path:
    bootstrap = ROOT / ".cache/bootstrap/bin/uv"
    if bootstrap.is_file():
        return bootstrap
    found = shutil.which("uv")
    if found is None:
        raise BuildError("no uv: run `make setup` (it installs .cache/bootstrap/bin/uv)")
    return Path(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.image", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "images",
        nargs="*",
        metavar="klet|redis|systemd-node",
        help="default: klet and redis (systemd-node is the systemd tests' node)",
    )
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".cache/image")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("KLET_CACHE", "/var/cache/klet")) / "image",
        help="where the rootfs and dependency layers are cached (default $KLET_CACHE/image)",
    )
    parser.add_argument(
        "--uv", type=Path, default=None, help="the uv binary (default: make setup's)"
    )
    args = parser.parse_args(argv)
    wanted = args.images or ["klet", "redis"]
    if unknown := set(wanted) - {"klet", "redis", "systemd-node"}:
        parser.error(f"unknown image(s): {', '.join(sorted(unknown))}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    cache = LayerCache(args.cache_dir)
    try:
        uv = args.uv or default_uv()
        built = []
        if "klet" in wanted:
            built.append(build_klet(out_dir=args.out_dir, cache=cache, uv=uv))
        if "redis" in wanted:
            built.append(build_redis(out_dir=args.out_dir, cache=cache))
        if "systemd-node" in wanted:
            built.append(build_systemd_node(out_dir=args.out_dir, cache=cache, uv=uv))
    except BuildError as err:
        print(f"image: {err}", file=sys.stderr)
        return 1
    for image in built:
        print(image.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

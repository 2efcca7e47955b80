"""The three layers of the klet image, each built by a host tool and cached by its inputs.

1. **rootfs**: a Debian bookworm minbase made by `mmdebstrap` with the packages the
   services execute or load (python3; `mount`/`umount` for syncloop's volumes; libc
   through ctypes). Keyed by a hash of the package list and the mmdebstrap options, so a
   new package rebuilds it and nothing else does (a cold build downloads the packages: a
   minute or two). A cached rootfs does not pick up Debian security updates by itself:
   remove the cache entry (or change the list) to refresh it.
2. **dependencies**: the third-party wheels pinned by uv.lock (`uv export`), installed by
   uv for the rootfs's Python and glibc into `/usr/local/lib/python3.X/dist-packages`,
   which Debian's python3 has on its path. Keyed by the exported requirements and the
   target Python, so an unchanged lock reuses it.
3. **workspace**: the wheels of libs and the five services, built by `uv build` from the
   worktree (the libs wheel carries the generated gRPC stubs), plus one script per
   `[project.scripts]` entry in /usr/local/bin. Small and rebuilt every time.

Python files are compiled to unchecked-hash .pyc files at build time: the image's file
system is read-only in spirit, and a service then starts without compiling its imports.
Every layer is reproducible: mmdebstrap runs with SOURCE_DATE_EPOCH (its file times are
clamped, and Debian's own .pyc files are then hash-checked rather than time-checked),
and the builder's tars have sorted entries with fixed times and owners. The same inputs
give the same image digest, so pushing an unchanged image moves nothing.
Layers are written to `<cache>/layers/<key>.tar.gz` with a `<key>.json` beside it holding
the digests; the cache is safe to share between concurrent builds (a file lock).
"""

from __future__ import annotations

import compileall
import fcntl
import hashlib
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tools.image.oci import Layer, canonical_json, compress_layer, file_chunks, tar_dir_chunks

ROOT = Path(__file__).resolve().parents[2]
WORKSPACE_PROJECTS = ("libs", *sorted(f"services/{p.name}" for p in (ROOT / "services").iterdir()))
SUITE = "bookworm"
SOURCES = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
# Bookworm's glibc is 2.36: wheels for any older manylinux tag run on it.
PYTHON_PLATFORM = "x86_64-manylinux_2_36"
# Bumped when the way a layer is made changes, so old cache entries are not reused.
LAYOUT_VERSION = 1


class BuildError(RuntimeError):
    """A step of the image build failed; the text names the step and its output."""


@dataclass(frozen=True)
class Rootfs:
    """A Debian root filesystem: its name (for logs) and the packages on top of minbase."""

    name: str
    packages: tuple[str, ...]
    # Documentation is left out, except the copyright files the licences ask to ship.
    dpkg_options: tuple[str, ...] = (
        "path-exclude=/usr/share/man/*",
        "path-exclude=/usr/share/info/*",
        "path-exclude=/usr/share/locale/*",
        "path-exclude=/usr/share/doc/*",
        "path-include=/usr/share/doc/*/copyright",
    )
    apt_options: tuple[str, ...] = ('APT::Install-Recommends "false"',)
    sources: tuple[str, ...] = field(default=SOURCES)

    def key(self) -> str:
        return _key(
            {
                "kind": "rootfs",
                "suite": SUITE,
                "packages": sorted(self.packages),
                "dpkg": list(self.dpkg_options),
                "apt": list(self.apt_options),
                "sources": list(self.sources),
            }
        )


@dataclass(frozen=True)
class BuiltRootfs:
    layer: Layer
    versions: dict[str, str]  # installed Debian package -> version

    def python_version(self) -> str:
        """The rootfs's Python as X.Y.Z, read from the python3.X package's version."""
        for package, version in sorted(self.versions.items()):
            if re.fullmatch(r"python3\.\d+", package):
                found = re.match(r"\d+\.\d+\.\d+", version)
                if found:
                    return found.group(0)
        raise BuildError("the rootfs has no python3.X package")


def _key(inputs: dict[str, object]) -> str:
    return hashlib.sha256(canonical_json({"layout": LAYOUT_VERSION, **inputs})).hexdigest()[:32]


class LayerCache:
    """Layers by key under `dir/layers`, built at most once (one build at a time)."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir / "layers"

    def get(self, key: str) -> tuple[Layer, dict[str, object]] | None:
        meta_path = self.dir / f"{key}.json"
        blob = self.dir / f"{key}.tar.gz"
        if not (meta_path.is_file() and blob.is_file()):
            return None
        meta = json.loads(meta_path.read_text())
        layer = Layer.from_json(blob, meta["layer"])
        if blob.stat().st_size != layer.size:
            return None
        return layer, dict(meta.get("extra", {}))

    def put(
        self, key: str, build: Callable[[Path], tuple[Layer, dict[str, object]]]
    ) -> tuple[Layer, dict[str, object]]:
        """The cached layer of `key`, or `build(blob_path)`'s result, stored under `key`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with _locked(self.dir / ".lock"):
            found = self.get(key)
            if found is not None:
                return found
            layer, extra = build(self.dir / f"{key}.tar.gz")
            meta = {"layer": layer.to_json(), "extra": extra}
            tmp = self.dir / f"{key}.json.tmp"
            tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
            tmp.replace(self.dir / f"{key}.json")
            return layer, extra


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], *, what: str, env: dict[str, str] | None = None) -> str:
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except OSError as err:
        raise BuildError(f"{what}: cannot run {argv[0]}: {err}") from err
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip()[-3000:]
        raise BuildError(f"{what}: {' '.join(argv[:3])}... exited {res.returncode}:\n{tail}")
    return res.stdout


def rootfs_layer(spec: Rootfs, cache: LayerCache) -> BuiltRootfs:
    """The rootfs layer of `spec`, from the cache or from a fresh mmdebstrap run."""

    def build(dest: Path) -> tuple[Layer, dict[str, object]]:
        with tempfile.TemporaryDirectory(prefix="klet-rootfs-") as tmp:
            raw = Path(tmp) / "rootfs.tar"
            _run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--mode=root",
                    "--quiet",
                    f"--include={','.join(sorted(spec.packages))}",
                    # No usrmerge package (it drags perl in): the hook makes /bin etc.
                    # links into /usr as bookworm expects.
                    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                    # Runtimes create /dev themselves; device nodes do not belong in a layer.
                    "--skip=output/dev",
                    "--skip=output/mknod",
                    *(f"--aptopt={o}" for o in spec.apt_options),
                    *(f"--dpkgopt={o}" for o in spec.dpkg_options),
                    SUITE,
                    str(raw),
                    *spec.sources,
                ],
                what=f"mmdebstrap of the {spec.name} rootfs",
                # Reproducible file times and no machine-specific leftovers.
                env={"SOURCE_DATE_EPOCH": "946684800"},
            )
            versions = _package_versions(raw)
            layer = compress_layer(file_chunks(raw), dest)
        return layer, {"versions": versions}

    layer, extra = cache.put(spec.key(), build)
    versions = extra.get("versions")
    assert isinstance(versions, dict)
    return BuiltRootfs(layer=layer, versions={str(k): str(v) for k, v in versions.items()})


def _package_versions(rootfs_tar: Path) -> dict[str, str]:
    """Installed package -> version, from the rootfs's dpkg status file."""
    with tarfile.open(rootfs_tar) as tar:
        for name in ("./var/lib/dpkg/status", "var/lib/dpkg/status"):
            try:
                member = tar.extractfile(name)
            except KeyError:
                continue
            if member is not None:
                status = member.read().decode()
                break
        else:
            raise BuildError(f"{rootfs_tar}: no var/lib/dpkg/status")
    versions: dict[str, str] = {}
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if "Package" in fields and fields.get("Status", "").endswith(" installed"):
            versions[fields["Package"]] = fields.get("Version", "")
    return versions


def site_packages(python_version: str) -> str:
    """Where Debian's python3 looks for locally installed packages."""
    major_minor = ".".join(python_version.split(".")[:2])
    return f"usr/local/lib/python{major_minor}/dist-packages"


def site_packages_python(target: Path) -> str:
    """`pythonX.Y` from a site_packages() path."""
    return target.parent.name


def dependencies_layer(*, uv: Path, python_version: str, cache: LayerCache) -> Layer:
    """The third-party packages of uv.lock, installed for the image's Python."""
    requirements = _run(
        [
            str(uv),
            "export",
            "--frozen",
            "--no-dev",
            "--all-packages",
            "--no-emit-workspace",
            "--no-hashes",
            "--no-header",
            "--no-annotate",
            "--format=requirements.txt",
        ],
        what="uv export of the locked dependencies",
    )
    key = _key(
        {
            "kind": "dependencies",
            "requirements": requirements,
            "python": python_version,
            "platform": PYTHON_PLATFORM,
        }
    )

    def build(dest: Path) -> tuple[Layer, dict[str, object]]:
        with tempfile.TemporaryDirectory(prefix="klet-deps-") as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(requirements)
            stage = Path(tmp) / "root"
            target = _pip_install(
                uv, stage, python_version, ["--no-deps", "--only-binary", ":all:", "-r", str(req)]
            )
            # Console scripts of the dependencies carry the host's interpreter in their
            # shebang; the services need none of them.
            shutil.rmtree(target / "bin", ignore_errors=True)
            _compile(stage, target)
            return compress_layer(tar_dir_chunks(stage), dest), {"requirements": requirements}

    layer, _ = cache.put(key, build)
    return layer


NOT_SHIPPED = ("klet_testbed-",)
"""Workspace wheels the images leave out: the tests' control plane, PKI, dockerd and the
unit tests' fakes."""

TEST_CODE_NAME = re.compile(r"(testing|fake\w*)(\.py)?")


def shipped_test_code(root: Path) -> list[str]:
    """The modules and packages under `root` (a source tree's or the image's `klet/`)
    named as test code (`testing`, `fake*`), relative to `root`. The unit tests' fakes
    live in `klet.testbed.fakes` (the test bed's wheel, `NOT_SHIPPED`); one beside its
    interface in libs or a service would be installed in the image."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if "__pycache__" not in path.parts
        and (path.is_dir() or path.suffix == ".py")
        and TEST_CODE_NAME.fullmatch(path.name)
    )


def workspace_layer(*, uv: Path, python_version: str, dest: Path) -> Layer:
    """libs and the five services from their wheels, and their console scripts (not the
    test bed, `NOT_SHIPPED`)."""
    gen = ROOT / "libs/src/klet/rpc/gen"
    if not (gen / "__init__.py").is_file():
        raise BuildError(f"{gen} is missing: run `make proto` first")
    with tempfile.TemporaryDirectory(prefix="klet-ws-") as tmp:
        wheels = Path(tmp) / "wheels"
        _run(
            [str(uv), "build", "--all-packages", "--wheel", "--out-dir", str(wheels), "--quiet"],
            what="uv build of the workspace wheels",
        )
        built = sorted(str(p) for p in wheels.glob("*.whl") if not p.name.startswith(NOT_SHIPPED))
        stage = Path(tmp) / "root"
        target = _pip_install(uv, stage, python_version, ["--no-deps", *built])
        shutil.rmtree(target / "bin", ignore_errors=True)
        _forget_wheel_paths(target)
        if not (target / "klet/rpc/gen/__init__.py").is_file():
            raise BuildError("the klet-libs wheel does not carry klet/rpc/gen")
        if (target / "klet/testbed").exists():
            raise BuildError("the test bed (klet.testbed) ended up in the image")
        if found := shipped_test_code(target / "klet"):
            raise BuildError(f"test code would be in the image: {', '.join(found)}")
        bin_dir = stage / "usr/local/bin"
        bin_dir.mkdir(parents=True)
        for name, entry in console_scripts().items():
            module, _, func = entry.partition(":")
            script = bin_dir / name
            script.write_text(
                f"#!/usr/bin/python3\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"
            )
            script.chmod(0o755)
        _compile(stage, target)
        return compress_layer(tar_dir_chunks(stage), dest)


def _forget_wheel_paths(target: Path) -> None:
    """Drop the install records that name this build's temporary wheel paths.

    uv notes where a local wheel came from (`direct_url.json`, `uv_cache.json`); in the
    image those paths mean nothing, and they would make every build's layer differ.
    """
    for dist_info in target.glob("*.dist-info"):
        dropped = {"direct_url.json", "uv_cache.json"}
        for name in dropped:
            (dist_info / name).unlink(missing_ok=True)
        record = dist_info / "RECORD"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text(
            "".join(line for line in lines if line.split(",", 1)[0].split("/")[-1] not in dropped)
        )


def console_scripts() -> dict[str, str]:
    """`[project.scripts]` of every workspace project: script name -> `module:function`."""
    scripts: dict[str, str] = {}
    for project in WORKSPACE_PROJECTS:
        meta = tomllib.loads((ROOT / project / "pyproject.toml").read_text())
        scripts.update(meta["project"].get("scripts", {}))
    return scripts


def _pip_install(uv: Path, stage: Path, python_version: str, args: list[str]) -> Path:
    target = stage / site_packages(python_version)
    _run(
        [
            str(uv),
            "pip",
            "install",
            "--quiet",
            "--target",
            str(target),
            "--python-version",
            python_version,
            "--python-platform",
            PYTHON_PLATFORM,
            *args,
        ],
        what=f"uv pip install into {target}",
    )
    return target


def _compile(stage: Path, target: Path) -> None:
    """Byte-compile `target` as the image's path, with hashes instead of source mtimes.

    The host's interpreter writes the .pyc files, so it must be the image's X.Y (the
    bytecode format changes between minor versions, never within one).
    """
    image_python = site_packages_python(target)
    if image_python != f"python{sys.version_info.major}.{sys.version_info.minor}":
        raise BuildError(f"the image has {image_python}, this build runs {sys.version}")
    ok = compileall.compile_dir(
        str(target),
        quiet=2,
        ddir="/" + str(target.relative_to(stage)),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        workers=0,
    )
    if not ok:
        raise BuildError(f"byte-compiling {target} failed")

"""The libs wheel carries the generated gRPC stubs or is not built: `uv build` of a copy
of libs/ beside a copy of proto/ fails naming the proto files when klet.rpc.gen is
missing or older than them, and succeeds with them there, the wheel listing them
(libs/hatch_build.py). Real uv and hatchling (setup's uv; hatchling from uv's cache or
PyPI, as `make image` builds the wheels)."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".cache/bootstrap/bin/uv"


def build(libs: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(out), str(libs)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_libs_wheel_is_built_only_with_current_stubs(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    shutil.copytree(
        ROOT / "libs",
        tmp_path / "libs",
        ignore=shutil.ignore_patterns("__pycache__", "gen", "*.egg-info"),
    )
    out = tmp_path / "dist"

    missing = build(tmp_path / "libs", out)
    assert missing.returncode != 0
    assert "run `make proto`" in missing.stderr, missing.stderr
    assert "proto/klet/podcontrol/v1/podcontrol.proto" in missing.stderr
    assert not list(out.glob("*.whl"))

    gen = tmp_path / "libs/src/klet/rpc/gen"
    shutil.copytree(
        ROOT / "libs/src/klet/rpc/gen", gen, ignore=shutil.ignore_patterns("__pycache__")
    )
    stale = tmp_path / "proto/klet/gc/v1/gc.proto"
    later = max(p.stat().st_mtime for p in gen.rglob("*.py")) + 10
    os.utime(stale, (later, later))
    refused = build(tmp_path / "libs", out)
    assert refused.returncode != 0
    assert "proto/klet/gc/v1/gc.proto" in refused.stderr
    assert "podcontrol.proto" not in refused.stderr

    os.utime(stale, (later - 20, later - 20))
    built = build(tmp_path / "libs", out)
    assert built.returncode == 0, built.stderr
    [wheel] = out.glob("klet_libs-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "klet/rpc/gen/klet/podcontrol/v1/podcontrol_pb2_grpc.py" in names
    assert "klet/rpc/gen/klet/gc/v1/gc_pb2.py" in names

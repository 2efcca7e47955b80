"""The committed table of upstream's kubelet flags (klet.config.kubeletflaglist) is what
tools/cluster/kubeletflags prints from the k8s.io/kubernetes module of go.mod: every flag,
its type, default, no-value default and deprecation. Built with build.sh's Go environment
(the module and build caches under $KLET_CACHE, no network once they are warm: about 20 s
here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from klet.config import kubeletflaglist

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_flag_list_is_upstreams() -> None:
    cache = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
    go = shutil.which("go") or "/usr/local/go/bin/go"
    assert Path(go).exists(), "no Go toolchain (looked on PATH and at /usr/local/go/bin/go)"
    out = subprocess.run(
        [go, "run", "./kubeletflags"],
        cwd=ROOT / "tools" / "cluster",
        env={
            **os.environ,
            "GOMODCACHE": str(cache / "go" / "mod"),
            "GOCACHE": str(cache / "go" / "build"),
            "GOTOOLCHAIN": "local",
            "GOFLAGS": "-mod=readonly -buildvcs=false",
            "CGO_ENABLED": "0",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    generated: dict[str, Any] = {}
    exec(compile(out.stdout, "kubeletflaglist (generated)", "exec"), generated)
    assert generated["KUBERNETES_VERSION"] == kubeletflaglist.KUBERNETES_VERSION
    want = {name: tuple(flag) for name, flag in generated["FLAGS"].items()}
    have = {name: tuple(flag) for name, flag in kubeletflaglist.FLAGS.items()}
    assert have == want, "regenerate: (cd tools/cluster && go run ./kubeletflags > ...)"

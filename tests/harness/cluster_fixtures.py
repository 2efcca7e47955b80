"""Pytest fixtures for the cluster tier: a real etcd + kube-apiserver (``klet.testbed.cluster``),
and for the tests that need them also kube-controller-manager and kube-scheduler.

Loaded as a plugin, like ``tests.harness.fixtures``: pyproject's pytest ``addopts`` gets
``-p tests.harness.cluster_fixtures`` (or pass it on the command line).

``control_plane`` is session-scoped: one etcd and apiserver for the whole run, in a short
private directory under /tmp, with the ``default``/``kube-system``/... namespaces ready
for pods (default ServiceAccount, ``kube-root-ca.crt``). Tests sharing it use unique
object names and clean up after themselves; a test that takes the apiserver down
(``restart_apiserver``) must leave it running.

``full_control_plane`` is a second, separate plane (its own etcd, apiserver, PKI and
/tmp directory) that also runs kube-controller-manager and kube-scheduler. It is
session-scoped too but started only when a test asks for it, so runs without such tests
pay nothing, and ``control_plane`` keeps its controller-less behaviour (tests on it bind
pods with ``spec.nodeName`` and create namespaces through ``prepare_namespace``).

``metrics_server_binary`` is the pinned metrics-server from
``tools/metrics-server/build.sh`` (same rule: built by make, or fail at once).

The binaries come from ``tools/cluster/build.sh``, a no-op once they are cached under
``$KLET_CACHE`` (default /var/cache/klet). A cold build takes about eight minutes on 2 cores,
longer than the per-test timeout, so when nothing is cached yet the fixture fails at once
and says to run ``make cluster-binaries`` first (or pass ``--timeout=0``). Set
``KLET_KEEP_DEVSTACK=1`` to keep the directory (logs, PKI, kubeconfigs) after the run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.testbed.cluster import ControlPlane

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "cluster" / "build.sh"
METRICS_SERVER_BUILD_SCRIPT = REPO / "tools" / "metrics-server" / "build.sh"


def _required_version(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if match is None:
        raise RuntimeError(f"{go_mod} does not require {module}")
    return match.group(1)


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release the control plane is built from, e.g. ``v1.34.4``."""
    return _required_version(REPO / "tools" / "cluster" / "go.mod", "k8s.io/kubernetes")


def etcd_version() -> str:
    """The etcd release the control plane is built from, e.g. ``v3.6.16``."""
    return _required_version(
        REPO / "tools" / "cluster" / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3"
    )


def _build(
    config: pytest.Config,
    script: Path = BUILD_SCRIPT,
    *,
    what: str = "control-plane binaries are",
    target: str = "cluster-binaries",
) -> Path:
    """Run a build.sh and return what it printed last (the bin dir or the binary)."""
    env = dict(os.environ)
    check = subprocess.run(
        ["bash", str(script), "--check"], capture_output=True, text=True, env=env
    )
    if check.returncode != 0:
        timeout = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
        if timeout and timeout < 3600:
            pytest.fail(
                f"{what} not built yet and a cold build takes several minutes (longer "
                f"than the test timeout): run `make {target}` first, or run pytest with "
                "--timeout=0",
                pytrace=False,
            )
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        pytest.fail(f"{script} failed:\n{res.stderr[-4000:]}", pytrace=False)
    return Path(res.stdout.strip().splitlines()[-1])


def _plane(
    config: pytest.Config, *, prefix: str, controllers: bool, **options: Any
) -> Iterator[ControlPlane]:
    bin_dir = _build(config)
    dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    plane = ControlPlane(dir, bin_dir, controllers=controllers, **options)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
        if not os.environ.get("KLET_KEEP_DEVSTACK"):
            shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """A started etcd + kube-apiserver (Node,RBAC authorization, NodeRestriction)."""
    yield from _plane(pytestconfig, prefix="klet-cp-", controllers=False)


@pytest.fixture(scope="session")
def full_control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """Another etcd + kube-apiserver, with kube-controller-manager and kube-scheduler."""
    yield from _plane(pytestconfig, prefix="klet-cpfull-", controllers=True)


@pytest.fixture(scope="session")
def metrics_server_binary(pytestconfig: pytest.Config) -> Path:
    """The pinned metrics-server, from ``tools/metrics-server/build.sh``."""
    return _build(
        pytestconfig,
        METRICS_SERVER_BUILD_SCRIPT,
        what="metrics-server is",
        target="metrics-server-binary",
    )

"""Shared test configuration: a test's tier is its directory, and every coroutine test
fails if it leaves tasks running.

The tier markers (STYLE.md 21) come from where a test lives, not from a marker each file
must remember: tests/integration is `integration`, tests/cluster, tests/soak and
tests/conformance (the e2e smoke subset) are `cluster`, tests/compose is `compose`
(docker-compose.yml on a private dockerd, against the cluster harness's apiserver),
tests/helm is `helm` (the chart rendered and linted by the pinned helm binaries, and
installed on the cluster harness), tests/systemd is `systemd` (a node container with
systemd as PID 1 on a private dockerd), everything else is the unit tier
(`-m "not integration and not cluster and not compose and not helm and not systemd"`).

The harness fixtures (real Redis, containerd, registry) are loaded as a plugin from
pyproject.toml (`-p tests.harness.fixtures`).

Captured log lines carry each record's `extra=` fields (`key=value`, as klet's text
logs do): klet logs the cause of a failure as a field (`error=...`), and a failing
test's "Captured log" must show it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from klet.obs.logs import fields_text
from klet.obs.supervise import awaiting

# The soak (tests/soak) runs for tens of minutes: only `make soak` (KLET_SOAK=1) collects it.
# The image tests (tests/image) build the deployment images: only `make test-image`
# (KLET_IMAGE_TESTS=1) collects them, until the compose tier makes them part of `make test`.
collect_ignore = [] if os.environ.get("KLET_SOAK") else ["soak"]
if not os.environ.get("KLET_IMAGE_TESTS"):
    collect_ignore.append("image")
# The CSI sidecars' tests need `make csi-binaries` (minutes cold, outside CI's budget):
# only `make test-csi` (KLET_CSI_TESTS=1) collects them, and then they must pass.
if not os.environ.get("KLET_CSI_TESTS"):
    collect_ignore += [
        "integration/test_csi_images.py",
        "cluster/test_csi_sidecars.py",
        "cluster/test_csi_block.py",
        "cluster/test_csi_snapshots.py",
    ]
# kubeadm init/join/reset with klet as the kubelet runs in a mount and network namespace
# of its own and takes about two minutes: only `make test-kubeadm` (KLET_KUBEADM_TESTS=1,
# under unshare) collects it, and then it must pass. `make test` collects the wrapper that
# runs kubeadm's smoke (init without addons, an upgrade-style edit, reset) in such a
# namespace; inside one (KLET_KUBEADM_TESTS=1) the wrapper is not collected.
if os.environ.get("KLET_KUBEADM_TESTS"):
    collect_ignore.append("kubeadm/test_kubeadm_in_make_test.py")
else:
    collect_ignore += ["kubeadm/test_kubeadm_init.py", "kubeadm/test_kubeadm_smoke.py"]
# `kubectl top` needs metrics-server built (about 4 CPU-minutes cold, outside CI's budget):
# only `make test-top` (KLET_TOP_TESTS=1) collects it, and then it must pass.
if not os.environ.get("KLET_TOP_TESTS"):
    collect_ignore.append("cluster/test_kubectl_top.py")

# The DRA tests build upstream's driver (tools/dra/build.sh), test_dra_cdi and
# test_dra_pods also containerd v2 (tools/dra/build-containerd.sh, minutes cold): only
# `make test-dra` (KLET_DRA_TESTS=1) collects them, and then they must pass.
if not os.environ.get("KLET_DRA_TESTS"):
    collect_ignore.append("cluster/test_dra_driver.py")
    collect_ignore.append("cluster/test_dra_cdi.py")
    collect_ignore.append("cluster/test_dra_pods.py")

TESTS = Path(__file__).parent
TIERS = {
    "integration": "integration",
    "cluster": "cluster",
    "soak": "cluster",
    "kubeadm": "cluster",
    "conformance": "cluster",
    "compose": "compose",
    "helm": "helm",
    "systemd": "systemd",
}


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leaked = [
        t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()
    ]
    where = {t.get_name(): awaiting(t) for t in leaked}
    for t in leaked:
        t.cancel()
    assert not leaked, f"test left tasks running: {where}"


class _WithFields(logging.Formatter):
    """pytest's own log line, then the record's extra fields."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        fields = fields_text(record)
        return f"{line} {fields}" if fields else line


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin("logging-plugin")
    if plugin is None:  # -p no:logging
        return
    for handler in (plugin.caplog_handler, plugin.report_handler):
        if handler.formatter is not None:
            handler.setFormatter(_WithFields(handler.formatter))


def tier_of(path: Path) -> str | None:
    """The tier marker of a test file by its directory under tests/; None for the unit tier."""
    if not path.is_relative_to(TESTS):
        return None
    return TIERS.get(path.relative_to(TESTS).parts[0])


# tryfirst: the markers must be on the items before `-m` deselects by them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            item.fixturenames.insert(0, "no_leaked_tasks")

"""Credential provider plugins for real: a plugin executable in
--image-credential-provider-bin-dir, named by --image-credential-provider-config, gives
the only credentials for the harness's authenticating registry, and syncloop's pulls on
the real containerd succeed with them.

The plugin is klet's own test plugin (written here, a Python script speaking
credentialprovider.kubelet.k8s.io/v1), not upstream's test/e2e_node gcp-credential-provider:
that one asks GCE's metadata server for a token and answers only for gcr.io patterns, so
it cannot give credentials for a local registry. It records every request it gets, so
the test sees the exec protocol (the repository as the image, the configured args and
env, the kubelet's environment kept) and the cache (cacheKeyType Registry: two images of
the registry, one run), and syncloop serves upstream's plugin metrics. The exec's
failure paths (non-zero exit with its stderr, the timeout, a bad answer) run against
real processes too, counted in upstream's kubelet_credential_provider_plugin_duration and
_errors_total as upstream's runPlugin counts them, and a cancelled run (syncloop
stopping) kills its plugin.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.config.credentialproviders import CredentialProvider
from klet.devstack import DevStack
from klet.syncloop.containers.credentialplugins import ExecPlugin, PluginFailed
from klet.syncloop.metrics import CredentialProviderMetrics
from prometheus_client import CollectorRegistry

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tests.integration.test_image_pull import (
    PASSWORD,
    REPOSITORY,
    USER,
    Private,
    manifest,
    private_registry,
    running,
)

V1 = "credentialprovider.kubelet.k8s.io/v1"

PLUGIN = f"""#!{sys.executable}
import json, os, sys

request = json.load(sys.stdin)
log = sys.argv[1]
with open(log, "a") as f:
    f.write(json.dumps({{"request": request, "args": sys.argv[2:], "pid": os.getpid(),
                         "path_kept": bool(os.environ.get("PATH"))}}) + "\\n")
mode = os.environ.get("PLUGIN_MODE", "")
if mode == "fail":
    sys.stderr.write("no credentials today")
    sys.exit(3)
if mode == "sleep":
    import time
    time.sleep(30)
if mode == "garbage":
    print("this is not json")
    sys.exit(0)
print(json.dumps({{
    "apiVersion": request["apiVersion"],
    "kind": "CredentialProviderResponse",
    "cacheKeyType": "Registry",
    "auth": {{os.environ["PLUGIN_REGISTRY"]: {{
        "username": os.environ["PLUGIN_USER"], "password": os.environ["PLUGIN_PASSWORD"]}}}},
}}))
"""


def install_plugin(bin_dir: Path, name: str = "test-credential-provider") -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / name
    exe.write_text(PLUGIN)
    exe.chmod(0o755)
    return exe


def requests(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture(scope="module")
def private(devstack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    with private_registry(devstack, tmp_path_factory.mktemp("plugin-registry")) as found:
        yield found


def test_plugin_credentials_pull_from_the_authenticated_registry(
    node_factory: Any, manifests: Path, private: Private, tmp_path: Path
) -> None:
    bin_dir, log = tmp_path / "plugins", tmp_path / "plugin.log"
    install_plugin(bin_dir)
    address = private.registry.address
    config = tmp_path / "credential-providers.yaml"
    config.write_text(
        f"""\
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: test-credential-provider
    matchImages: ["{address}"]
    defaultCacheDuration: 1h
    apiVersion: {V1}
    args: ["{log}", "--from-config"]
    env:
      - {{name: PLUGIN_REGISTRY, value: "{address}"}}
      - {{name: PLUGIN_USER, value: {USER}}}
      - {{name: PLUGIN_PASSWORD, value: {PASSWORD}}}
"""
    )
    node: KletNode = node_factory(
        manifest_dir=manifests,
        extra_flags=[
            f"--image-credential-provider-config={config}",
            f"--image-credential-provider-bin-dir={bin_dir}",
        ],
    )
    assert not (node.root_dir / "config.json").exists()  # no node credentials
    node.start()
    first, second = private.fresh_tag(), private.fresh_tag()
    (manifests / "viaplugin.yaml").write_text(manifest("viaplugin", (first, "IfNotPresent")))
    wait_for(lambda: running(node, "viaplugin"), timeout_s=40, what="viaplugin Running")
    (manifests / "cached.yaml").write_text(manifest("cached", (second, "IfNotPresent")))
    wait_for(lambda: running(node, "cached"), timeout_s=40, what="cached Running")
    assert private.served(first) == 1 and private.served(second) == 1

    # One run for both images: the answer was for the registry, cached for an hour.
    (seen,) = requests(log)
    assert seen["request"] == {
        "apiVersion": V1,
        "kind": "CredentialProviderRequest",
        "image": f"{address}/{REPOSITORY}",
    }
    assert seen["args"] == ["--from-config"] and seen["path_kept"]
    assert (
        node.metric(
            "syncloop",
            "kubelet_credential_provider_plugin_duration_count",
            plugin_name="test-credential-provider",
        )
        == 1.0
    )
    digest = hashlib.sha256(len(config.read_bytes()).to_bytes(8, "big") + config.read_bytes())
    assert (
        node.metric(
            "syncloop",
            "kubelet_credential_provider_config_info",
            hash=f"sha256:{digest.hexdigest()}",
        )
        == 1.0
    )


def _exec(
    bin_dir: Path,
    log: Path,
    mode: str,
    *,
    timeout: float = 60.0,
    observer: CredentialProviderMetrics | None = None,
) -> ExecPlugin:
    provider = CredentialProvider(
        name="test-credential-provider",
        match_images=("r.io",),
        default_cache_duration=0.0,
        api_version=V1,
        args=(str(log),),
        env=(
            ("PLUGIN_MODE", mode),
            ("PLUGIN_REGISTRY", "r.io"),
            ("PLUGIN_USER", "u"),
            ("PLUGIN_PASSWORD", "p"),
        ),
    )
    if observer is None:
        return ExecPlugin(provider, bin_dir, timeout=timeout)
    return ExecPlugin(provider, bin_dir, timeout=timeout, observer=observer)


async def test_exec_failures_name_the_plugin_and_why(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    install_plugin(bin_dir)
    registry = CollectorRegistry()
    seen = CredentialProviderMetrics.create(registry, config_hash="sha256:00")
    answer = await _exec(bin_dir, log, "", observer=seen)("r.io/app")
    assert answer.cache_key_type == "Registry" and answer.auth["r.io"].username == "u"
    with pytest.raises(PluginFailed, match="exit status 3: no credentials today"):
        await _exec(bin_dir, log, "fail", observer=seen)("r.io/app")
    with pytest.raises(PluginFailed, match="error decoding credential provider plugin response"):
        await _exec(bin_dir, log, "garbage", observer=seen)("r.io/app")
    with pytest.raises(PluginFailed, match="for image r.io/app: timed out after 0.5s"):
        await _exec(bin_dir, log, "sleep", timeout=0.5, observer=seen)("r.io/app")
    with pytest.raises(PluginFailed, match="error execing credential provider plugin"):
        await _exec(tmp_path / "nowhere", log, "", observer=seen)("r.io/app")
    assert len(requests(log)) == 4
    # upstream's plugin metrics: every run timed; the runs that did not exit 0 (the
    # exit 3, the timeout, the exec that found no file) are errors, as upstream's
    # runPlugin counts them; an answer that does not decode ran fine.
    plugin = {"plugin_name": "test-credential-provider"}
    prefix = "kubelet_credential_provider_plugin"
    assert registry.get_sample_value(f"{prefix}_duration_count", plugin) == 5
    assert registry.get_sample_value(f"{prefix}_errors_total", plugin) == 3
    sleeping = registry.get_sample_value(f"{prefix}_duration_sum", plugin)
    assert sleeping is not None and sleeping >= 0.5
    info = {"hash": "sha256:00"}
    assert registry.get_sample_value("kubelet_credential_provider_config_info", info) == 1


def _gone_or_zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def test_a_cancelled_run_leaves_no_plugin_running(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    install_plugin(bin_dir)
    run = asyncio.create_task(_exec(bin_dir, log, "sleep")("r.io/app"))
    (seen,) = await asyncio.to_thread(
        wait_for, lambda: requests(log), timeout_s=10, what="the plugin started"
    )
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.to_thread(
        wait_for, lambda: _gone_or_zombie(seen["pid"]), timeout_s=5, what="the plugin killed"
    )

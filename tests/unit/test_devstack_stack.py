"""klet.devstack.DevStack's choice of container runtime, decided at construction (no
daemon starts here).

Covers: by default the stack's containerd is Debian's 1.6 binary with the version 2
configuration and no CDI; `containerd_binary` with `cdi_spec_dirs` (the DRA conformance
run's node) runs that binary with the version 3 configuration, CDI on and reading those
directories alone, everything else (registry hosts, sandbox image) as the default's.
"""

from __future__ import annotations

from pathlib import Path

from klet.devstack import DevStack
from klet.devstack.containerd import CONTAINERD_BINARY
from klet.devstack.images import PAUSE_IMAGE, TEST_REGISTRY_HOST


def test_default_runtime_is_containerd_1_6_without_cdi(tmp_path: Path) -> None:
    stack = DevStack(tmp_path / "s")
    assert stack.containerd is not None
    assert stack.containerd.binary == CONTAINERD_BINARY
    assert stack.containerd.cdi_spec_dirs is None
    config = stack.containerd.config_toml()
    assert config.startswith("version = 2") and "enable_cdi" not in config


def test_cdi_runtime_runs_the_given_containerd_reading_the_given_dirs(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    stack = DevStack(tmp_path / "s", containerd_binary="/opt/v2/containerd", cdi_spec_dirs=(cdi,))
    ctrd = stack.containerd
    assert ctrd is not None
    assert ctrd.binary == "/opt/v2/containerd"
    assert ctrd.cdi_spec_dirs == (cdi.resolve(),)
    config = ctrd.config_toml()
    assert config.startswith("version = 3")
    assert "enable_cdi = true" in config and f'cdi_spec_dirs = ["{cdi.resolve()}"]' in config
    assert ctrd.sandbox_image == PAUSE_IMAGE
    assert ctrd.registry_host_map[TEST_REGISTRY_HOST] == stack.registry_address

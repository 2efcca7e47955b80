"""The pinned helm binaries of the helm tier (tools/helm/build.sh), and rendering with them.

`helm_binary("v4")` is the helm the tests render and install the chart with, `"v3"` the
one that proves it still lints on Helm 3. Each is built once into ``$KLET_CACHE``
(default /var/cache/klet) by `make helm-binaries`; a cold build takes minutes (longer
than a test's timeout), so when one is missing the caller fails at once and says to run
that target, as the cluster tier does for its control plane.

`render()` runs `helm template` on the chart with values files and `--set` pairs and
returns the parsed documents; `render_error()` returns helm's stderr of a rendering
that must fail. helm runs with HOME-like directories of its own (HELM_CONFIG_HOME,
HELM_CACHE_HOME, HELM_DATA_HOME under a temporary directory): a test reads nothing of
the user's helm set-up.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "helm" / "build.sh"
CHART = REPO / "helm" / "klet"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


@functools.cache
def helm_binary(major: str) -> Path:
    """The cached helm of `major` ("v4" or "v3"); fails the test when it is not built."""
    res = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--check", major], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.fail(
            f"helm {major} is not built yet and a cold build takes minutes: run "
            f"`make helm-binaries` first ({res.stderr.strip()})",
            pytrace=False,
        )
    return Path(res.stdout.strip().splitlines()[-1])


@functools.cache
def _helm_home() -> Path:
    return Path(tempfile.mkdtemp(prefix="klet-helm-home-"))


def helm_env() -> dict[str, str]:
    home = _helm_home()
    return {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(major: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [str(helm_binary(major)), *args], capture_output=True, text=True, env=helm_env(), timeout=60
    )
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {res.returncode}:\n{res.stderr}")
    return res


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key twice in one mapping (PyYAML keeps the last one
    silently; the apiserver's decoder may refuse or pick either)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _template_args(values: Sequence[Path], sets: Sequence[str]) -> list[str]:
    args = ["template", "klet", str(CHART), "--namespace", "klet-system"]
    for f in values:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def _render(values: tuple[Path, ...], sets: tuple[str, ...], major: str) -> str:
    return helm(major, *_template_args(values, sets)).stdout


def render(
    values: Sequence[Path] = (), sets: Sequence[str] = (), *, major: str = "v4"
) -> list[dict[str, Any]]:
    """The documents `helm template` renders (release "klet", namespace "klet-system")."""
    text = _render(tuple(values), tuple(sets), major)
    return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d]


def render_error(
    values: Sequence[Path] = (), sets: Sequence[str] = (), *, major: str = "v4"
) -> str:
    """helm's stderr for values that must not render; fails if they do."""
    res = helm(major, *_template_args(values, sets), check=False)
    assert res.returncode != 0, f"rendered although it should not: {values} {sets}"
    return res.stderr

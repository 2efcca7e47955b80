"""Hostile and broken configuration input found by the fuzzer (tests/fuzz): deep nesting,
YAML alias bombs and recursive aliases, malformed URLs, `--flag=--`, and cross-field
problems caused by a flag. Each is a ConfigError naming the file or flag, never another
exception; plus a short seeded run of the fuzzer itself (`make fuzz` runs 10,000)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from klet.config import ConfigError, load_settings

from tests.fuzz.kubelet_config import alias_bomb, fuzz_files, fuzz_flags

HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def problems(argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env={}, service="syncloop", hostname="node-1")
    return info.value.problems


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_deep_nesting(tmp_path: Path, depth: int, suffix: str) -> None:
    file = tmp_path / f"kubelet{suffix}"
    body = '{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", '
    file.write_text(body + '"maxPods": ' + "[" * depth + "]" * depth + "}")
    started = time.monotonic()
    (problem,) = problems(["--config", str(file)])
    assert problem.startswith(f"{file}: cannot parse: nested "), problem
    assert time.monotonic() - started < 5


def test_deep_block_mapping(tmp_path: Path) -> None:
    file = tmp_path / "kubelet.yaml"
    lines = [f"{'  ' * i}k{i}:" for i in range(80)]
    file.write_text(
        HEADER + "logging:\n  options:\n" + "\n".join("    " + x for x in lines) + " 1\n"
    )
    (problem,) = problems(["--config", str(file)])
    assert problem == f"{file}: cannot parse: nested more than 64 levels deep"


def test_alias_bomb(tmp_path: Path) -> None:
    file = tmp_path / "kubelet.yaml"
    file.write_text(alias_bomb(random.Random(3)))
    started = time.monotonic()
    (problem,) = problems(["--config", str(file)])
    assert problem == (
        f"{file}: cannot parse: holds more than 100000 values once YAML aliases are expanded"
    )
    assert time.monotonic() - started < 5


def test_recursive_alias(tmp_path: Path) -> None:
    file = tmp_path / "kubelet.yaml"
    file.write_text(HEADER + "clusterDNS: &a [*a]\n")
    assert problems(["--config", str(file)]) == [
        f"{file}: cannot parse: refers to itself (a recursive YAML alias)"
    ]


def test_small_aliases_still_load(tmp_path: Path) -> None:
    file = tmp_path / "kubelet.yaml"
    file.write_text(HEADER + "clusterDNS: &dns [10.0.0.10]\n")
    settings = load_settings(["--config", str(file)], env={}, service="syncloop", hostname="n")
    assert settings.kubelet.cluster_dns == ("10.0.0.10",)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--container-runtime-endpoint", "tcp://[::1"],
            "--container-runtime-endpoint: containerRuntimeEndpoint: must be a unix:///path "
            "or tcp://host:port URL, got 'tcp://[::1'",
        ),
        (
            ["--container-runtime-endpoint", "tcp://h:99999"],
            "--container-runtime-endpoint: containerRuntimeEndpoint: must be a unix:///path "
            "or tcp://host:port URL, got 'tcp://h:99999'",
        ),
        (
            ["--manifest-url", "http://["],
            "--manifest-url: staticPodURL: must be an http:// or https:// URL, got 'http://['",
        ),
        (
            ["--redis-url", "redis://[x"],
            "--redis-url: must be a redis://, rediss:// or unix:// URL, got 'redis://[x'",
        ),
        (["--registry-burst=--"], '--registry-burst: invalid integer "--"'),
        # a cross-field rule reported on the other field names the flag that caused it
        (
            ["--tls-cert-file", "/a.crt"],
            "--tls-cert-file: tlsPrivateKeyFile: tlsCertFile and tlsPrivateKeyFile must be "
            "set together",
        ),
        (
            ["--image-gc-high-threshold", "1"],
            "--image-gc-high-threshold: imageGCLowThresholdPercent: must be less than "
            "imageGCHighThresholdPercent (80 >= 1)",
        ),
    ],
)
def test_malformed_flags(argv: list[str], expected: str) -> None:
    assert expected in problems(argv)


def test_fuzz_subset(tmp_path: Path) -> None:
    """300 mutated files and 300 mutated flag sets: no crash, every rejection named."""
    for fn, name in ((fuzz_files, "files"), (fuzz_flags, "flags")):
        workdir = tmp_path / name
        workdir.mkdir()
        report = fn(300, 11, workdir, slow_s=10.0)  # a busy CI machine is not a crash
        assert report.cases == 300
        assert report.crashes == [], report.crashes
        assert report.rejected > 0

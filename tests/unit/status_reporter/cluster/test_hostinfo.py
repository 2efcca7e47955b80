"""Host facts for the Node: the /proc and /etc parsers, GOARCH names, and
`read_machine` over a fake host tree (missing files give empty fields, not errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.status_reporter.cluster.hostinfo import (
    detect_node_ips,
    go_arch,
    parse_hugepage_dir,
    parse_meminfo,
    parse_os_release,
    read_machine,
)


def test_parse_meminfo() -> None:
    text = "MemTotal:       16303920 kB\nMemFree:         1024 kB\n"
    assert parse_meminfo(text) == 16303920 * 1024
    assert parse_meminfo("MemFree: 1 kB\n") == 0


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\n', "Ubuntu 24.04.1 LTS"),
        ("PRETTY_NAME='Debian GNU/Linux 12'", "Debian GNU/Linux 12"),
        ("PRETTY_NAME=Alpine", "Alpine"),
        ("NAME=x\n", "Linux"),
        ("", "Linux"),
    ],
)
def test_parse_os_release(text: str, want: str) -> None:
    assert parse_os_release(text) == want


@pytest.mark.parametrize(
    ("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64"), ("ppc64le", "ppc64le")]
)
def test_go_arch(machine: str, arch: str) -> None:
    assert go_arch(machine) == arch


def test_parse_hugepage_dir() -> None:
    assert parse_hugepage_dir("hugepages-2048kB") == 2 * 1024 * 1024
    assert parse_hugepage_dir("hugepages-1048576kB") == 1024**3
    assert parse_hugepage_dir("other") is None


def test_read_machine_from_a_fake_tree(tmp_path: Path) -> None:
    root = tmp_path / "host"
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/meminfo").write_text("MemTotal: 2048 kB\n")
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    (root / "etc").mkdir()
    (root / "etc/machine-id").write_text("machine-1\n")
    (root / "etc/os-release").write_text('PRETTY_NAME="Test OS"\n')
    hp = root / "sys/kernel/mm/hugepages/hugepages-2048kB"
    hp.mkdir(parents=True)
    (hp / "nr_hugepages").write_text("3\n")
    info = read_machine(tmp_path / "does-not-exist-yet", fs_root=root)
    assert info.memory_bytes == 2048 * 1024
    assert info.boot_id == "boot-1"
    assert info.machine_id == "machine-1"
    assert info.system_uuid == ""  # no /sys/class/dmi in the tree
    assert info.os_image == "Test OS"
    assert info.hugepages == {2 * 1024 * 1024: 3 * 2 * 1024 * 1024}
    assert info.ephemeral_storage_bytes > 0  # the nearest existing parent's filesystem
    assert info.cpus >= 1


def test_node_ips_from_flag_win() -> None:
    assert detect_node_ips(("10.1.2.3",), "node1") == ("10.1.2.3",)
    assert len(detect_node_ips((), "localhost")) == 1

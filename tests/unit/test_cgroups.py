"""cgroup detection and stats on v1 and v2 trees laid out in a temporary directory:
working set = usage − inactive_file as upstream, swap usage and limit as cAdvisor reads
them (v1 total_swap and memsw.limit_in_bytes, v2 memory.swap.current and
memory.swap.max; unlimited is None), missing files give None, and removal
only rmdirs (a non-empty cgroup stays and is reported); the machine's MemTotal from a
meminfo file (0 when it cannot be read)."""

from __future__ import annotations

from pathlib import Path

from klet.cgroups import CgroupFS, detect
from klet.cgroups.machine import mem_total_bytes


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v1_stats(tmp_path: Path) -> None:
    pod = "kubepods/burstable/podu1"
    write(tmp_path / "memory" / pod / "memory.usage_in_bytes", "1000\n")
    write(
        tmp_path / "memory" / pod / "memory.stat",
        "cache 10\nswap 1\ntotal_inactive_file 300\ntotal_swap 4096\n",
    )
    write(tmp_path / "memory" / pod / "memory.memsw.limit_in_bytes", "134217728\n")
    write(tmp_path / "cpuacct" / pod / "cpuacct.usage", "123456\n")
    write(tmp_path / "pids" / pod / "pids.current", "7\n")
    fs = CgroupFS(tmp_path)
    assert detect(tmp_path) == 1 and fs.version == 1
    s = fs.stats(pod)
    assert (s.memory_usage_bytes, s.memory_working_set_bytes, s.cpu_usage_ns, s.pids) == (
        1000,
        700,
        123456,
        7,
    )
    # the hierarchy's swap, and memory+swap's limit as cAdvisor's spec takes it
    assert (s.swap_usage_bytes, s.swap_limit_bytes) == (4096, 128 << 20)
    write(tmp_path / "memory" / pod / "memory.memsw.limit_in_bytes", "9223372036854771712\n")
    assert fs.stats(pod).swap_limit_bytes is None  # unlimited
    assert fs.exists(pod)


def test_v2_stats(tmp_path: Path) -> None:
    write(tmp_path / "cgroup.controllers", "cpu memory pids\n")
    pod = "kubepods/podu2"
    write(tmp_path / pod / "memory.current", "2000\n")
    write(tmp_path / pod / "memory.stat", "anon 5\ninactive_file 500\n")
    write(tmp_path / pod / "cpu.stat", "usage_usec 42\nuser_usec 40\n")
    write(tmp_path / pod / "pids.current", "3\n")
    write(tmp_path / pod / "memory.swap.current", "512\n")
    write(tmp_path / pod / "memory.swap.max", "1048576\n")
    s = CgroupFS(tmp_path).stats(pod)
    assert (s.memory_usage_bytes, s.memory_working_set_bytes, s.cpu_usage_ns, s.pids) == (
        2000,
        1500,
        42000,
        3,
    )
    assert (s.swap_usage_bytes, s.swap_limit_bytes) == (512, 1 << 20)
    write(tmp_path / pod / "memory.swap.max", "max\n")
    assert CgroupFS(tmp_path).stats(pod).swap_limit_bytes is None


def test_missing_files_are_none(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    s = CgroupFS(tmp_path).stats("kubepods/nothing")
    assert s == type(s)(None, None, None, None)


def test_remove_only_empty_cgroups(tmp_path: Path) -> None:
    for ctrl in ("memory", "cpu"):
        (tmp_path / ctrl / "kubepods" / "besteffort" / "podu3" / "sandbox").mkdir(parents=True)
    fs = CgroupFS(tmp_path)
    assert fs.remove("/kubepods/besteffort/podu3") == []
    assert not fs.exists("kubepods/besteffort/podu3")
    write(tmp_path / "memory" / "kubepods" / "podu4" / "tasks", "1\n")  # a file: rmdir fails
    left = fs.remove("kubepods/podu4")
    assert len(left) == 1 and "podu4" in left[0]


def test_mem_total_bytes(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       1000 kB\nMemFree: 1 kB\n")
    assert mem_total_bytes(f) == 1024000
    assert mem_total_bytes(tmp_path / "nope") == 0

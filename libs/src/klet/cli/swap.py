"""Refusing to start with swap on (KubeletConfiguration `failSwapOn`, default true).

Upstream's kubelet reads /proc/swaps when it starts: any line past the header is an
active swap device, and with failSwapOn true it exits with an error (a missing
/proc/swaps counts as no swap; an unreadable one is an error). Each klet service does
the same from the shared entry sequence (`klet.cli.service.run_service`), before its
event loop starts, so a node with swap runs none of them.

With failSwapOn false upstream starts and keeps containers out of swap instead
(`memorySwap.swapBehavior` NoSwap: a memory+swap limit equal to the memory limit on
cgroup v1, memory.swap.max 0 on v2), where the host has a swap controller; syncloop sets
the same limits (klet.syncloop.model.resources). As upstream, a container without
a memory limit gets no memory+swap limit on v1 either. A host with swap on and no swap
controller (a v1 kernel without swap accounting) could not keep any container out of
swap: klet refuses to start there, naming why, where upstream would start regardless.
On a node without swap the field changes nothing, in klet as upstream.

`swap_devices` is the pure parse; `swap_problem` is the read around it.
"""

from __future__ import annotations

from pathlib import Path

from klet.cgroups import fs

__all__ = ["PROC_SWAPS", "swap_devices", "swap_problem"]

PROC_SWAPS = Path("/proc/swaps")


def swap_devices(text: str) -> list[str]:
    """The active swap devices (or files) a /proc/swaps text lists, past its header."""
    lines = [line for line in text.splitlines() if line.strip()]
    return [line.split()[0] for line in lines[1:]]


def swap_problem(
    fail_swap_on: bool, swaps: Path = PROC_SWAPS, *, swap_control: str | None = None
) -> str | None:
    """Why this node may not run klet because of swap, naming the field; None if it may."""
    try:
        text = swaps.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"failSwapOn: cannot tell whether swap is on: {swaps}: {err.strerror or err}"
    devices = swap_devices(text)
    if not devices:
        return None
    where = f"{', '.join(devices)} in {swaps}"
    if fail_swap_on:
        return (
            f"failSwapOn: swap is on ({where}); klet refuses to start with swap on, as "
            "upstream's kubelet does: turn swap off (swapoff -a)"
        )
    control = fs.swap_control() if swap_control is None else swap_control
    if control:
        return None
    return (
        f"failSwapOn: false with swap on ({where}) needs a swap controller to keep "
        "containers out of swap (memorySwap.swapBehavior NoSwap), and this host has none "
        "(no memory.memsw.limit_in_bytes on cgroup v1: boot with swapaccount=1; no "
        "memory.swap.max on v2); turn swap off (swapoff -a)"
    )

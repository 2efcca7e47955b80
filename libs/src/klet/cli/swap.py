"""Refusing to start with swap on (KubeletConfiguration `failSwapOn`, default true).

Upstream's kubelet reads /proc/swaps when it starts: any line past the header is an
active swap device, and with failSwapOn true it exits with an error (a missing
/proc/swaps counts as no swap; an unreadable one is an error). Each klet service does
the same from the shared entry sequence (`klet.cli.service.run_service`), before its
event loop starts, so a node with swap runs none of them.

With failSwapOn false upstream starts and keeps containers out of swap instead
(`memorySwap.swapBehavior` NoSwap: a memory+swap limit equal to the memory limit on
cgroup v1, memory.swap.max 0 on v2). klet sets no swap limits, so on a node with swap it
refuses to start whatever failSwapOn says, and the message says why: starting would let
containers swap where the operator was promised they do not. On a node without swap the
field changes nothing, in klet as upstream.

`swap_devices` is the pure parse; `swap_problem` is the read around it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PROC_SWAPS", "swap_devices", "swap_problem"]

PROC_SWAPS = Path("/proc/swaps")


def swap_devices(text: str) -> list[str]:
    """The active swap devices (or files) a /proc/swaps text lists, past its header."""
    lines = [line for line in text.splitlines() if line.strip()]
    return [line.split()[0] for line in lines[1:]]


def swap_problem(fail_swap_on: bool, swaps: Path = PROC_SWAPS) -> str | None:
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
    return (
        f"failSwapOn: false is not implemented by klet while swap is on ({where}): "
        "upstream then keeps containers out of swap (memorySwap.swapBehavior NoSwap), and "
        "klet sets no swap limits; turn swap off (swapoff -a)"
    )

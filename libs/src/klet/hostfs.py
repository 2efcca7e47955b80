"""Host paths as the host sees them, for a klet whose services run in containers.

The Helm chart runs every service in a privileged pod with the host's PID namespace
and mounts only the directories klet needs (root dir, logs, run dir, runtime socket,
cgroups). A path the runtime on the host will use — a pod's hostPath volume, the image
filesystem CRI names — may not exist in the service's own mount namespace, or may be
another file there (the container's own /etc). PID 1 of the host's PID namespace lives
in the host's mount namespace, so `/proc/1/root/<path>` is the host's `<path>`.

`on_host(path)` is `path` itself when this process already shares PID 1's root (klet on
the host, or in a container without the host's PID namespace, where PID 1 is the
container's own init and there is no host to reach), else the path under `/proc/1/root`.
Absolute symlinks met below `/proc/1/root` resolve against this process's root, not the
host's: a hostPath through such a symlink is checked here as it resolves here.

Reading `/proc/1/root` needs ptrace access to PID 1. Where even root is refused (a VM
whose PID 1 is a non-dumpable init, like the firecracker VMs the tests run on) this
falls back to the service's own view, as before. The sturdier source would be the
runtime's own root: the PID serving the CRI socket (SO_PEERCRED) and `/proc/<pid>/root`,
the mount namespace that performs the mounts; not done yet.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HOST_ROOT", "on_host", "shares_host_root"]

HOST_ROOT = Path("/proc/1/root")


def shares_host_root(host_root: Path = HOST_ROOT) -> bool:
    """Whether this process's `/` is `host_root`'s (True when that cannot be read: then
    there is nothing better than our own view)."""
    try:
        ours, theirs = os.stat("/"), os.stat(host_root)
    except OSError:
        return True
    return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)


def on_host(path: Path, *, host_root: Path = HOST_ROOT) -> Path:
    """`path` (absolute) as the host sees it: see the module docstring."""
    if not path.is_absolute() or shares_host_root(host_root):
        return path
    return host_root / path.relative_to("/")

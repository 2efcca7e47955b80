"""cgroup v1/v2 detection, read-only stats, and removal of empty pod cgroups; and the
systemd driver's two errors, here rather than in klet.cgroups.systemd so that code
catching them (syncloop's cgroup drivers, built on every node) does not load the D-Bus
client (dbus-fast, about 3 MB resident) on a node whose cgroupDriver is cgroupfs."""

from klet.cgroups.fs import CgroupFS, CgroupStats, detect

__all__ = ["CgroupFS", "CgroupStats", "SystemdError", "SystemdUnavailable", "detect"]


class SystemdUnavailable(Exception):
    """systemd or its bus cannot be reached (or did not answer in time)."""


class SystemdError(Exception):
    """systemd refused a call; the text names the unit and systemd's error."""

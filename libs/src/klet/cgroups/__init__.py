"""cgroup v1/v2 detection, read-only stats, and removal of empty pod cgroups."""

from klet.cgroups.fs import CgroupFS, CgroupStats, detect

__all__ = ["CgroupFS", "CgroupStats", "detect"]

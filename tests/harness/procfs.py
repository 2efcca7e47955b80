"""What /proc says of a process, for the tiers that check running containers' confinement
(compose, helm)."""

from __future__ import annotations

from pathlib import Path


def status_field(pid: int | str, name: str) -> str:
    """A field of /proc/<pid>/status (`self` for this process)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise LookupError(f"/proc/{pid}/status has no {name}")

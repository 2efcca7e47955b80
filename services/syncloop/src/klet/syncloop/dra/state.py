"""The DRA checkpoint file, `<root-dir>/dra_manager_state` (claiminfo.py has its format).

As upstream's checkpointer: reading a missing file writes an empty checkpoint first
(GetOrCreate), so the file exists from the first start on; every write replaces the
file whole (a temporary file in the same directory, fsynced, renamed over it), so a
crash leaves the old checkpoint or the new one, never half of one. A file that is not
upstream's format is an error naming the file and the cause: upstream's kubelet refuses
to start on it ("please drain node and remove DRA state file"), and guessing which
claims are prepared would unprepare or double-prepare devices.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from klet.syncloop.dra.claiminfo import (
    CHECKPOINT_NAME,
    ClaimInfo,
    CorruptCheckpoint,
    decode,
    encode,
)


class DRACheckpointError(Exception):
    """The checkpoint file could not be read or written; names the file and the cause."""


class ClaimCheckpoint:
    """The checkpoint file in one root dir."""

    def __init__(self, root_dir: Path) -> None:
        self.path = root_dir / CHECKPOINT_NAME

    def load(self) -> list[ClaimInfo]:
        """The checkpointed claims; an empty checkpoint is written when there is none."""
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            self.store(())
            return []
        except OSError as err:
            raise DRACheckpointError(f"{self.path}: cannot read: {err}") from err
        try:
            return decode(blob)
        except CorruptCheckpoint as err:
            raise DRACheckpointError(
                f"{self.path}: {err} (drain the node and remove the DRA state file)"
            ) from err

    def store(self, claims: Iterable[ClaimInfo]) -> None:
        tmp = self.path.with_name(f".{CHECKPOINT_NAME}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(encode(claims))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as err:
            raise DRACheckpointError(f"{self.path}: cannot write: {err}") from err

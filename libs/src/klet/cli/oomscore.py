"""The oom_score_adj of a klet service process (KubeletConfiguration `oomScoreAdj`).

Upstream's kubelet writes oomScoreAdj (default -999) to its own /proc/self/oom_score_adj
when it starts, so that under memory pressure the kernel kills pods before the agent that
would evict them. klet's agent is five processes; each sets its own value from the shared
entry sequence (`klet.cli.service.run_service`), before its event loop starts, so every
one is as hard to kill as upstream's one. Child processes inherit the value, as they do
upstream.

Lowering the value needs CAP_SYS_RESOURCE, and some hosts refuse any negative value
(writing one fails with EIO; see HOST_NOTES). Upstream logs the failure and runs on; klet
does too, with a WARNING naming the field, the wish and the value the process keeps. The
syncloop's probe of the host's floor for containers (podcgroups.oom_score_adj_floor)
then sees the process's own value and clamps containers' values to it.
"""

from __future__ import annotations

import logging
from pathlib import Path

__all__ = ["OOM_SCORE_ADJ", "apply_oom_score_adj"]

log = logging.getLogger(__name__)

OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")


def apply_oom_score_adj(value: int, *, path: Path = OOM_SCORE_ADJ) -> str:
    """Set this process's oom_score_adj to `value`; "" when it holds it, else why not
    (also logged as a WARNING naming oomScoreAdj)."""
    try:
        current = path.read_text().strip()
    except OSError as err:
        current = "unknown"
        problem = f"cannot read {path}: {err.strerror or err}"
    else:
        if current == str(value):
            return ""
        try:
            path.write_text(str(value))
        except OSError as err:
            problem = f"writing {path}: {err.strerror or err}"
        else:
            log.debug("oom_score_adj set", extra={"field": "oomScoreAdj", "value": value})
            return ""
    log.warning(
        "oomScoreAdj: cannot set this process's oom_score_adj to %d (%s); it stays %s",
        value,
        problem,
        current,
        extra={"field": "oomScoreAdj", "wanted": value},
    )
    return problem

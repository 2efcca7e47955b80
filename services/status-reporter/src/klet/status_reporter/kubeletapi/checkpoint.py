"""`POST /checkpoint/{namespace}/{pod}/{container}` (ContainerCheckpoint): the runtime
writes a checkpoint archive of a running container under `<root-dir>/checkpoints/`.

Upstream's answers, which clients (its e2e spec among them) tell apart:

- 404 `pod does not exist` (not in the pod view), `container X does not exist` (no such
  name among the pod's containers, init or ephemeral containers), `cannot parse value of
  timeout parameter` (the last `timeout` value is not an integer: a 404, as upstream's);
- 500 `checkpointing of ns/pod/container failed (...)`, the cause in the brackets: the
  container not running (`container X not found`), a negative timeout, or the
  runtime's error in gRPC's Go form, e.g. `rpc error: code = Unimplemented desc = unknown
  method CheckpointContainer for service runtime.v1.RuntimeService` from a runtime
  without it (containerd 1.6), so a client can tell "not supported" from "failed";
- 200 `{"items":["<archive path>"]}`: the path is
  `checkpoint-<pod>_<namespace>-<container>-<RFC 3339 time>.tar`.

`timeout` (seconds) reaches the runtime as CRI's timeout; below runtimeRequestTimeout it
is raised to it (the CRI client's rule, klet.cri.client). The route exists only with the
ContainerCheckpoint feature gate on (beta, on by default): off, it is a 404 like any
unknown path. Authorization (nodes/checkpoint, verb create) is `attributes.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from klet.cri.errors import CRIError
from klet.model.types import JSON, ContainerID
from klet.status_reporter.kubeletapi import lookup

CHECKPOINTS_DIR = "checkpoints"
_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt takes in base 10


class CheckpointRuntime(lookup.RuntimeLister, Protocol):
    """The CRI calls of a checkpoint (klet.cri.RuntimeClient conforms)."""

    async def checkpoint_container(
        self, container_id: ContainerID, location: str, *, timeout_s: int = 0
    ) -> None: ...


class CheckpointError(Exception):
    """An answer other than 200: `status` and the plain-text body."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(body)
        self.status = status
        self.body = body


def parse_timeout(values: Sequence[str]) -> int:
    """The `timeout` query parameter: the last of its values, 0 when absent. Raises
    CheckpointError (404, as upstream answers) when that value is not an integer."""
    if not values:
        return 0
    if not _INTEGER.fullmatch(values[-1]) or abs(int(values[-1])) >= 1 << 63:
        raise CheckpointError(404, "cannot parse value of timeout parameter")
    return int(values[-1])


def archive_path(root_dir: Path, namespace: str, pod: str, container: str, at: datetime) -> Path:
    """Where the runtime is asked to write the archive (upstream's file name; the pod's
    full name is `<name>_<namespace>`)."""
    stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return root_dir / CHECKPOINTS_DIR / f"checkpoint-{pod}_{namespace}-{container}-{stamp}.tar"


def answer_body(location: Path) -> str:
    """The 200 body: the archive's path in a list."""
    return json.dumps({"items": [str(location)]}, separators=(",", ":"))


async def checkpoint(
    runtime: CheckpointRuntime,
    pod_list: JSON,
    root_dir: Path,
    target: tuple[str, str, str],
    timeouts: Sequence[str],
    *,
    now: datetime | None = None,
) -> str:
    """Checkpoint `target` (namespace, pod, container) and return the 200 body. Raises
    CheckpointError with upstream's status and body."""
    namespace, pod_name, container = target
    pod = lookup.find_pod(pod_list, namespace, pod_name)
    if pod is None:
        raise CheckpointError(404, "pod does not exist")
    if not lookup.has_container(pod, container):
        raise CheckpointError(404, f"container {container} does not exist")
    timeout_s = parse_timeout(timeouts)
    location = archive_path(root_dir, namespace, pod_name, container, now or datetime.now(UTC))

    def failed(cause: str) -> CheckpointError:
        return CheckpointError(
            500, f"checkpointing of {namespace}/{pod_name}/{container} failed ({cause})"
        )

    try:
        cid = await lookup.running_container(runtime, lookup.pod_uid(pod), container)
    except lookup.TargetError:
        raise failed(f"container {container} not found") from None
    except CRIError as err:
        raise failed(str(err)) from err
    if timeout_s < 0:
        raise failed("CheckpointContainer requires the timeout value to be >= 0")
    # As upstream, which makes the directory at start (mode 0700) while the gate is on.
    await asyncio.to_thread(location.parent.mkdir, mode=0o700, parents=True, exist_ok=True)
    try:
        await runtime.checkpoint_container(cid, str(location), timeout_s=timeout_s)
    except CRIError as err:
        raise failed(str(err)) from err
    return answer_body(location)

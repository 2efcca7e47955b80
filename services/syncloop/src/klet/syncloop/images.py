"""Image pulls per imagePullPolicy, with upstream's pull back-off and pull parallelism.

Always pulls every time; IfNotPresent asks ImageStatus first; Never refuses a missing
image (ErrImageNeverPull). A failed pull is ErrImagePull, and further attempts for the
same pod and image wait out a back-off (10 s doubling to 300 s) during which the
container shows ImagePullBackOff. serializeImagePulls (the default) allows one pull at a
time; otherwise maxParallelImagePulls bounds them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from klet.cri import CRIError
from klet.cri.types import SandboxConfig
from klet.model.types import JSON
from klet.syncloop import podspec
from klet.syncloop.backoff import Backoff
from klet.syncloop.events import EventSink
from klet.syncloop.ports import ImageService


@dataclass(frozen=True)
class PullOutcome:
    image_ref: str | None
    waiting: tuple[str, str] | None = None  # (reason, message) when not pulled
    wake_at: float | None = None


class ImagePuller:
    def __init__(
        self,
        cri: ImageService,
        events: EventSink,
        *,
        parallel: int | None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cri = cri
        self.events = events
        self._sem = asyncio.Semaphore(parallel if parallel and parallel > 0 else 1)
        self.backoff = backoff or Backoff()
        self.clock = clock
        self._failed_at: dict[str, float] = {}

    async def ensure(self, pod: JSON, container: JSON, sandbox: SandboxConfig) -> PullOutcome:
        image = str(container.get("image", ""))
        policy = podspec.image_pull_policy(container)
        present = None if policy == "Always" else await self.cri.image_status(image)
        if present is not None:
            self.events.emit(
                pod,
                "Normal",
                "Pulled",
                f'Container image "{image}" already present on machine',
                field_path=_field_path(container),
            )
            return PullOutcome(str(present.id))
        if policy == "Never":
            message = f'Container image "{image}" is not present with pull policy of Never'
            self.events.emit(
                pod, "Warning", "ErrImageNeverPull", message, field_path=_field_path(container)
            )
            return PullOutcome(None, ("ErrImageNeverPull", message))
        key = f"{podspec.meta(pod).get('uid')}_{image}"
        now = self.clock()
        failed_at = self._failed_at.get(key)
        if failed_at is not None and self.backoff.in_backoff_since(key, failed_at, now):
            message = f'Back-off pulling image "{image}"'
            self.events.emit(pod, "Normal", "BackOff", message, field_path=_field_path(container))
            return PullOutcome(
                None, ("ImagePullBackOff", message), failed_at + self.backoff.delay(key, now)
            )
        self.events.emit(
            pod, "Normal", "Pulling", f'Pulling image "{image}"', field_path=_field_path(container)
        )
        started = time.monotonic()
        try:
            async with self._sem:
                ref = await self.cri.pull_image(image, sandbox_config=sandbox)
        except CRIError as err:
            self.backoff.next(key, now)
            self._failed_at[key] = self.clock()
            message = f'Failed to pull image "{image}": {err}'
            self.events.emit(pod, "Warning", "Failed", message, field_path=_field_path(container))
            return PullOutcome(
                None, ("ErrImagePull", message), self._failed_at[key] + self.backoff.delay(key, now)
            )
        self._failed_at.pop(key, None)
        self.backoff.reset(key)
        took = time.monotonic() - started
        self.events.emit(
            pod,
            "Normal",
            "Pulled",
            f'Successfully pulled image "{image}" in {took:.3f}s',
            field_path=_field_path(container),
        )
        return PullOutcome(str(ref))


def _field_path(container: JSON) -> str:
    return f"spec.containers{{{container.get('name', '')}}}"

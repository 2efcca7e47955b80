"""Image pulls per imagePullPolicy, with credentials, pacing and back-off as upstream's.

Always pulls every time; IfNotPresent asks ImageStatus first; Never refuses a missing
image (ErrImageNeverPull). An image without tag or digest is pulled as `:latest`; a name
that does not parse is InvalidImageName. A failed pull is ErrImagePull, and further
attempts for the same pod and image wait out a back-off (10 s doubling to 300 s) during
which the container shows ImagePullBackOff, with the last pull error in its message.

Credentials (keyring.py): the pod's imagePullSecrets, read from the apiserver in cluster
mode, then the node's docker configuration files; each matching credential is tried in
turn, and an image no credential matches is pulled anonymously. The credential
provider plugins of --image-credential-provider-config (credentialplugins.py) come last,
as upstream's union keyring puts them after the node's files. A pull secret that
cannot be read gives upstream's FailedToRetrieveImagePullSecret warning and the pull
goes on with what there is. Upstream reads the pull secrets at every pod sync; here
they are read only when a pull is about to happen, which is the only time they matter.

Pacing: serializeImagePulls (the default) lets one pull run at a time and queues the
others; otherwise maxParallelImagePulls bounds them (unset = no bound). On top of
that registryPullQPS/registryBurst is a token bucket over every PullImage call, and, as
upstream's, a call without a token fails at once with "pull QPS exceeded" (and so goes
into the back-off) rather than waiting; QPS 0 means no limit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from klet.cri import CRIError
from klet.cri.types import AuthConfig, ImageInfo, SandboxConfig
from klet.model.flowcontrol import Backoff, TokenBucket
from klet.model.types import JSON
from klet.syncloop.containers import keyring
from klet.syncloop.criprotocols import ImageService
from klet.syncloop.environment.kubeobjects import KubeObjects, ObjectUnavailable
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec

log = logging.getLogger(__name__)

QPS_EXCEEDED = "pull QPS exceeded"
# Upstream's pod worker syncs a pod again about 10 s after a failed sync, so while a long
# back-off runs the container is seen in ImagePullBackOff rather than ErrImagePull.
RESYNC_AFTER_ERROR_S = 10.0
_SPECIAL_ERRORS = {
    # CRI error names a runtime may start its message with, and upstream's wording.
    "RegistryUnavailable": "because the registry is unavailable",
    "SignatureValidationFailed": "because the signature validation failed",
}


@dataclass(frozen=True)
class PullOutcome:
    image_ref: str | None
    waiting: tuple[str, str] | None = None  # (reason, message) when not pulled
    wake_at: float | None = None
    info: ImageInfo | None = None
    """The image's ImageStatus as `ensure` read it (present, or after its pull), so the
    container's start reads the image's user from it instead of asking CRI again
    (issue 42: one ImageStatus per container start where there were two); None when
    `ensure` has none to give."""


def pull_parallelism(*, serialize: bool, max_parallel: int | None) -> int | None:
    """How many pulls may run at once: 1 when serialized, else maxParallelImagePulls
    (None = no bound), as upstream chooses between its serial and parallel pullers."""
    return 1 if serialize else max_parallel


class NodeCredentials:
    """The node's docker configuration (config.json / .dockercfg in upstream's places),
    re-read whenever one of the candidate files changes.

    Upstream caches what it read for five minutes; comparing the files' stat data at
    each pull costs a few syscalls and sees a new file at once.
    """

    def __init__(self, root_dir: Path, *, cwd: Path | None = None, home: Path | None = None):
        self.paths = keyring.docker_config_paths(
            root_dir,
            cwd=cwd or Path.cwd(),
            home=home or Path(os.environ.get("HOME") or "/"),
        )
        self._signature: tuple[tuple[int, int] | None, ...] | None = None
        self._config: keyring.DockerConfig = {}

    def __call__(self) -> keyring.DockerConfig:
        signature = tuple(_stat(p) for p in (*self.paths[0], *self.paths[1]))
        if signature != self._signature:
            self._config = keyring.node_docker_config(self.paths, _read)
            self._signature = signature
        return self._config


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


class PluginCredentials(Protocol):
    """The credential provider plugins (credentialplugins.PluginKeyring); `pod` is the
    pod pulling, whose service account token a provider may be given."""

    async def lookup(self, repository: str, pod: JSON | None = None) -> list[AuthConfig]: ...


@dataclass(frozen=True)
class PullCredentials:
    """Where credentials come from: the node's docker configuration, in cluster mode the
    pods' pull secrets through the apiserver (`objects`), and the plugins."""

    node: Callable[[], Mapping[str, AuthConfig]] = dict
    objects: KubeObjects | None = None
    plugins: PluginCredentials | None = None


@dataclass
class _Attempt:
    started: float
    errors: list[str] = field(default_factory=list)


class PullObserver(Protocol):
    """Told of pulls (syncloop's metrics: kubelet_image_pull_duration_seconds and the pod
    start SLI, which leaves out the time a pod's images took)."""

    def pulling(self, uid: str, now: float) -> None: ...

    def pulled(self, uid: str, now: float, *, seconds: float, size: int) -> None: ...


class _NoObserver:
    def pulling(self, uid: str, now: float) -> None:
        return None

    def pulled(self, uid: str, now: float, *, seconds: float, size: int) -> None:
        return None


class ImagePuller:
    def __init__(
        self,
        cri: ImageService,
        events: EventSink,
        *,
        parallel: int | None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        rate: TokenBucket | None = None,
        credentials: PullCredentials | None = None,
        observer: PullObserver | None = None,
    ) -> None:
        self.cri = cri
        self.observer: PullObserver = observer or _NoObserver()
        self.events = events
        self._sem = asyncio.Semaphore(parallel) if parallel and parallel > 0 else None
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.rate = rate
        self.credentials = credentials or PullCredentials()
        self._failed_at: dict[str, float] = {}
        self._last_error: dict[str, str] = {}

    def _gate(self) -> AbstractAsyncContextManager[object]:
        return self._sem if self._sem is not None else nullcontext()

    async def ensure(self, pod: JSON, container: JSON, sandbox: SandboxConfig) -> PullOutcome:
        image = str(container.get("image", ""))
        path = podspec.field_path(pod, str(container.get("name", "")))
        policy = podspec.image_pull_policy(container)

        def fail(reason: str, message: str, wake_at: float | None = None) -> PullOutcome:
            # upstream's startContainer adds this second event naming the reason
            self.events.emit(pod, "Warning", "Failed", f"Error: {reason}", field_path=path)
            return PullOutcome(None, (reason, message), wake_at)

        try:
            tagged = keyring.with_default_tag(image)
        except keyring.KeyringError as err:
            message = f'Failed to apply default image tag "{image}": {err}'
            self.events.emit(pod, "Warning", "InspectFailed", message, field_path=path)
            return fail("InvalidImageName", message)
        if policy != "Always":
            try:
                present = await self.cri.image_status(tagged)
            except CRIError as err:
                message = f'Failed to inspect image "{image}": {err}'
                self.events.emit(pod, "Warning", "InspectFailed", message, field_path=path)
                return fail("ImageInspectError", message)
            if present is not None:
                self.events.emit(
                    pod,
                    "Normal",
                    "Pulled",
                    f'Container image "{image}" already present on machine',
                    field_path=path,
                )
                return PullOutcome(str(present.id), info=present)
            if policy == "Never":
                message = f'Container image "{image}" is not present with pull policy of Never'
                self.events.emit(pod, "Warning", "ErrImageNeverPull", message, field_path=path)
                return fail("ErrImageNeverPull", message)
        key = f"{podspec.meta(pod).get('uid')}_{image}"
        now = self.clock()
        failed_at = self._failed_at.get(key)
        if failed_at is not None and self.backoff.in_backoff_since(key, failed_at, now):
            message = f'Back-off pulling image "{image}"'
            self.events.emit(pod, "Normal", "BackOff", message, field_path=path)
            if key in self._last_error:
                message = f"{message}: {self._last_error[key]}"
            return fail("ImagePullBackOff", message, failed_at + self.backoff.delay(key, now))
        credentials = await self._credentials(pod, tagged)
        self.events.emit(pod, "Normal", "Pulling", f'Pulling image "{image}"', field_path=path)
        uid = str(podspec.meta(pod).get("uid", ""))
        self.observer.pulling(uid, self.clock())
        attempt = _Attempt(started=time.monotonic())
        ref, pulled_in = await self._pull(tagged, sandbox, credentials, attempt)
        if ref is None:
            error = _aggregate(attempt.errors)
            self.events.emit(
                pod,
                "Warning",
                "Failed",
                f'Failed to pull image "{image}": {error}',
                field_path=path,
            )
            self.backoff.next(key, now)
            self._failed_at[key] = self.clock()
            reason, message = _pull_error(image, error)
            self._last_error[key] = f"{reason}: {message}"
            retry = min(self.backoff.delay(key, now), RESYNC_AFTER_ERROR_S)
            return fail(reason, message, self._failed_at[key] + retry)
        self.backoff.reset(key)
        self._forget_expired(now)
        waited = time.monotonic() - attempt.started
        info = await self._inspect(ref)
        size = info.size if info is not None else 0
        self.observer.pulled(uid, self.clock(), seconds=waited, size=size)
        self.events.emit(
            pod,
            "Normal",
            "Pulled",
            f'Successfully pulled image "{image}" in {go_duration(pulled_in)} '
            f"({go_duration(waited)} including waiting). Image size: {size} bytes.",
            field_path=path,
        )
        return PullOutcome(ref, info=info)

    def _forget_expired(self, now: float) -> None:
        """Drop back-off state nobody waits on any more (pods gone, or pulled since)."""
        self.backoff.gc(now)
        for key in [k for k in self._failed_at if self.backoff.delay(k, now) == 0]:
            self._failed_at.pop(key, None)
            self._last_error.pop(key, None)

    async def _pull(
        self,
        image: str,
        sandbox: SandboxConfig,
        credentials: list[AuthConfig],
        attempt: _Attempt,
    ) -> tuple[str | None, float]:
        """Try each credential (or none) in turn; the image ref and the pull's own time."""
        async with self._gate():
            started = time.monotonic()
            attempts: list[AuthConfig | None] = list(credentials) or [None]
            for auth in attempts:
                if self.rate is not None and not self.rate.try_take(self.clock()):
                    attempt.errors.append(QPS_EXCEEDED)
                    continue
                try:
                    ref = await self.cri.pull_image(image, sandbox_config=sandbox, auth=auth)
                except CRIError as err:
                    attempt.errors.append(_cri_message(err))
                    continue
                return str(ref), time.monotonic() - started
            return None, time.monotonic() - started

    async def _credentials(self, pod: JSON, image: str) -> list[AuthConfig]:
        secrets = await self._pull_secrets(pod)
        found = keyring.pull_credentials(image, secrets=secrets, node=self.credentials.node())
        if self.credentials.plugins is not None:
            repository = keyring.parse_image(image).repository
            found += await self.credentials.plugins.lookup(repository, pod)
        return found

    async def _pull_secrets(self, pod: JSON) -> list[keyring.DockerConfig]:
        names = [
            str(ref.get("name"))
            for ref in pod.get("spec", {}).get("imagePullSecrets") or []
            if ref.get("name")  # the API admits empty names; upstream skips them silently
        ]
        if not names:
            return []
        namespace = str(podspec.meta(pod).get("namespace") or "default")
        configs: list[keyring.DockerConfig] = []
        failed: list[str] = []
        for name in names:
            config = await self._pull_secret(namespace, name)
            if config is None:
                failed.append(name)
            else:
                configs.append(config)
        if failed:
            self.events.emit(
                pod,
                "Warning",
                "FailedToRetrieveImagePullSecret",
                f"Unable to retrieve some image pull secrets ({', '.join(failed)}); "
                "attempting to pull the image may not succeed.",
            )
        return configs

    async def _pull_secret(self, namespace: str, name: str) -> keyring.DockerConfig | None:
        """A pull secret's docker configuration ({} for another type of secret), or None
        when it cannot be had: no apiserver, absent, unreadable or malformed."""
        objects = self.credentials.objects
        if objects is None:
            return None
        try:
            secret = await objects.get_secret(namespace, name)
            if secret is None:
                return None
            return keyring.secret_docker_config(secret) or {}
        except (ObjectUnavailable, keyring.KeyringError) as err:
            log.info(
                "pull secret not usable",
                extra={"secret": f"{namespace}/{name}", "error": str(err)},
            )
            return None

    async def _inspect(self, ref: str) -> ImageInfo | None:
        """The pulled image's status, for its size (best effort as upstream: None when
        unknown) and the container's user."""
        try:
            return await self.cri.image_status(ref)
        except CRIError:
            return None


def _cri_message(err: CRIError) -> str:
    """The runtime's own message, without the client's `PullImage: CODE: ` prefix."""
    text = str(err)
    prefix = f"PullImage: {err.code}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def _aggregate(errors: list[str]) -> str:
    """Several attempts' errors as upstream's aggregate prints them (duplicates once)."""
    distinct = list(dict.fromkeys(errors))
    return distinct[0] if len(distinct) == 1 else f"[{', '.join(distinct)}]"


def _pull_error(image: str, error: str) -> tuple[str, str]:
    """The waiting reason and message for a failed pull (upstream's evalCRIPullErr)."""
    for name, why in _SPECIAL_ERRORS.items():
        if error.startswith(name):
            return name, f"image pull failed for {image} {why}{error[len(name) :]}"
    return "ErrImagePull", error


def go_duration(seconds: float) -> str:
    """A duration truncated to milliseconds, written as Go's time.Duration prints it."""
    ms = int(max(seconds, 0.0) * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".")
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return f"{out}{secs}s"

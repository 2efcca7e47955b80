"""Credential provider plugins run for image pulls (KEP-2133), as upstream's kubelet runs them.

Each provider of `--image-credential-provider-config` is an executable in
`--image-credential-provider-bin-dir`, run as `<bin-dir>/<name> args...` with the
kubelet's environment plus the provider's `env`, the request on stdin and the response
read from stdout (credentialprovider.py has the protocol and the cache). A run is given
one minute, as upstream's catch-all timeout, then killed.

Concurrent pulls of one image share one run (upstream's singleflight). A plugin that
fails, times out or answers badly gives no credentials for that pull (the pull goes on
with the others, or anonymously) and is logged; it is run again at the next pull, since
nothing was cached. Every provider's answer goes into one keyring, looked up most
specific pattern first, and these credentials come after the pod's pull secrets and the
node's docker configuration (images.ImagePuller), as upstream's union keyring orders them.

Not implemented: `tokenAttributes` (refused when the configuration is loaded).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from klet.config.credentialproviders import (
    CredentialProvider,
    CredentialProviderConfig,
    describe,
)
from klet.cri.types import AuthConfig
from klet.syncloop.containers import credentialprovider as protocol
from klet.syncloop.containers.keyring import DockerConfig, Keyring

log = logging.getLogger(__name__)

EXEC_TIMEOUT_S = 60.0
CACHE_PURGE_INTERVAL_S = 15 * 60.0


class PluginFailed(Exception):
    """A plugin run that produced no usable answer."""


class PluginObserver(Protocol):
    """Told of each plugin run (syncloop's kubelet_credential_provider_plugin_* metrics)."""

    def plugin_ran(self, name: str, *, seconds: float, failed: bool) -> None: ...


class _NoObserver:
    def plugin_ran(self, name: str, *, seconds: float, failed: bool) -> None:
        return None


@dataclass(frozen=True)
class ExecPlugin:
    """Runs one provider's executable once per request."""

    provider: CredentialProvider
    bin_dir: Path
    timeout: float = EXEC_TIMEOUT_S
    environ: Callable[[], Mapping[str, str]] = lambda: os.environ
    observer: PluginObserver = field(default_factory=lambda: _NoObserver())

    async def __call__(self, repository: str) -> protocol.PluginResponse:
        started = time.monotonic()
        try:
            stdout = await self._run(repository)
        except PluginFailed:
            self.observer.plugin_ran(
                self.provider.name, seconds=time.monotonic() - started, failed=True
            )
            raise
        self.observer.plugin_ran(
            self.provider.name, seconds=time.monotonic() - started, failed=False
        )
        try:
            return protocol.decode_response(stdout, self.provider.api_version)
        except protocol.ResponseError as err:
            raise PluginFailed(f"plugin {self.provider.name}: {err}") from err

    async def _run(self, repository: str) -> bytes:
        """The plugin's stdout; PluginFailed when it cannot run, times out or fails."""
        name = self.provider.name
        env = {**self.environ(), **dict(self.provider.env)}
        try:
            proc = await asyncio.create_subprocess_exec(
                str(self.bin_dir / name),
                *self.provider.args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as err:
            raise PluginFailed(f"error execing credential provider plugin {name}: {err}") from err
        request = protocol.encode_request(self.provider.api_version, repository)
        try:
            async with asyncio.timeout(self.timeout):
                stdout, stderr = await proc.communicate(request)
        except TimeoutError:
            raise PluginFailed(
                f"error execing credential provider plugin {name} for image {repository}: "
                f"timed out after {self.timeout:g}s"
            ) from None
        finally:
            if proc.returncode is None:  # timed out, or syncloop is stopping: no orphan
                proc.kill()
        if proc.returncode != 0:
            raise PluginFailed(
                f"error execing credential provider plugin {name} for image {repository}: "
                f"exit status {proc.returncode}: {stderr.decode(errors='replace').strip()}"
            )
        return stdout


RunPlugin = Callable[[str], Awaitable[protocol.PluginResponse]]
"""One run of a provider's plugin for a repository (ExecPlugin; tests give their own)."""


class PluginProvider:
    """One provider: its patterns, its cache, and one run per image at a time."""

    def __init__(
        self,
        provider: CredentialProvider,
        run: RunPlugin,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self._run = run
        self.clock = clock
        self.cache = protocol.CredentialCache()
        self._inflight: dict[str, asyncio.Task[protocol.PluginResponse]] = {}
        self._last_purge = clock()

    async def provide(self, repository: str) -> DockerConfig:
        """The provider's docker configuration for `repository`; {} when it does not
        match, or its plugin failed (logged)."""
        if not protocol.image_allowed(self.provider.match_images, repository):
            return {}
        now = self.clock()
        if now - self._last_purge > CACHE_PURGE_INTERVAL_S:
            self.cache.purge(now)
            self._last_purge = now
        cached = self.cache.get(repository, now)
        if cached is not None:
            return cached
        task = self._inflight.get(repository)
        if task is None:
            task = asyncio.ensure_future(self._run(repository))
            self._inflight[repository] = task
            task.add_done_callback(lambda t: self._finished(repository, t))
        try:
            response = await asyncio.shield(task)
        except (PluginFailed, OSError) as err:
            log.warning(
                "Failed getting credential from external registry credential provider",
                extra={"provider": self.provider.name, "image": repository, "error": str(err)},
            )
            return {}
        expiry = protocol.expires_at(response, self.provider.default_cache_duration, self.clock())
        if expiry is not None:
            key = protocol.cache_key(response.cache_key_type, repository)
            self.cache.put(key, response.auth, expiry)
        return response.auth

    def _finished(self, repository: str, task: asyncio.Task[protocol.PluginResponse]) -> None:
        self._inflight.pop(repository, None)
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have been cancelled


class PluginKeyring:
    """Every configured provider, looked up together (a `images.PluginCredentials`)."""

    def __init__(self, providers: list[PluginProvider]) -> None:
        self.providers = providers

    @classmethod
    def from_config(
        cls, config: CredentialProviderConfig, *, observer: PluginObserver | None = None
    ) -> PluginKeyring:
        log.info(
            "credential provider plugins registered",
            extra={"providers": describe(config.providers), "bin_dir": str(config.bin_dir)},
        )
        return cls(
            [
                PluginProvider(p, ExecPlugin(p, config.bin_dir, observer=observer or _NoObserver()))
                for p in config.providers
            ]
        )

    async def lookup(self, repository: str) -> list[AuthConfig]:
        """Credentials for `repository` from every provider, most specific pattern first."""
        configs = [await p.provide(repository) for p in self.providers]
        return Keyring(configs).lookup(repository)

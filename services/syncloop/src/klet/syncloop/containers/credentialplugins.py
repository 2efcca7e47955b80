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

A provider with `tokenAttributes` runs per pod (upstream's perPodPluginProvider): for a
pod with a service account, syncloop reads the ServiceAccount from the apiserver (its
UID and annotations; a required annotation missing means the plugin is not run),
requests a token for it bound to the pod with the provider's audience (the TokenRequest
API, through the token manager projected volumes use: its cache and refresh rules) and
passes both in the request. A pod without a service account gets nothing from a
provider with `requireServiceAccount: true`, and runs the plugin without a token
otherwise (static pods). Whatever cannot be had (no apiserver: a standalone node, an
absent or unreadable ServiceAccount, a refused TokenRequest) gives no credentials from
that provider for that pull and is logged, as upstream; the pull goes on without them.
Concurrent pulls share a run only with the same token and annotations.
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
    TokenAttributes,
    describe,
)
from klet.cri.types import AuthConfig
from klet.model.types import JSON
from klet.syncloop.containers import credentialprovider as protocol
from klet.syncloop.containers.keyring import DockerConfig, Keyring
from klet.syncloop.environment.kubeobjects import ObjectUnavailable
from klet.syncloop.volumes.tokens import TokenError

log = logging.getLogger(__name__)

EXEC_TIMEOUT_S = 60.0
CACHE_PURGE_INTERVAL_S = 15 * 60.0
# upstream leaves expirationSeconds unset and the apiserver defaults it to one hour
TOKEN_EXPIRATION_S = 3600


class PluginFailed(Exception):
    """A plugin run that produced no usable answer."""


class PluginObserver(Protocol):
    """Told of each plugin run (syncloop's kubelet_credential_provider_plugin_* metrics)."""

    def plugin_ran(self, name: str, *, seconds: float, failed: bool) -> None: ...


class _NoObserver:
    def plugin_ran(self, name: str, *, seconds: float, failed: bool) -> None:
        return None


class AccountUnavailable(Exception):
    """The pod's ServiceAccount or its token could not be had."""


class ServiceAccounts(Protocol):
    """Reads a ServiceAccount (environment.kubeobjects.ApiObjects); None when absent,
    ObjectUnavailable when the apiserver cannot answer."""

    async def get_service_account(self, namespace: str, name: str) -> JSON | None: ...


class TokenIssuer(Protocol):
    """Bound service account tokens (volumes.tokens.TokenManager); TokenError when none
    can be had."""

    async def token(
        self,
        pod: JSON,
        *,
        service_account: str,
        audience: str,
        expiration_s: int,
        service_account_uid: str = "",
    ) -> tuple[str, float]: ...


@dataclass(frozen=True)
class AccountSource:
    """Where service accounts and their tokens come from; both None on a standalone node."""

    accounts: ServiceAccounts | None = None
    tokens: TokenIssuer | None = None


@dataclass(frozen=True)
class PullingPod:
    """The pod an image is pulled for, as a provider with tokenAttributes needs it."""

    namespace: str
    name: str
    uid: str
    service_account: str  # spec.serviceAccountName; "" for none

    @classmethod
    def of(cls, pod: JSON) -> PullingPod:
        meta = pod.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            service_account=str((pod.get("spec") or {}).get("serviceAccountName") or ""),
        )


@dataclass(frozen=True)
class _Account:
    token: str
    annotations: Mapping[str, str]
    cache_key: str


@dataclass(frozen=True)
class ExecPlugin:
    """Runs one provider's executable once per request."""

    provider: CredentialProvider
    bin_dir: Path
    timeout: float = EXEC_TIMEOUT_S
    environ: Callable[[], Mapping[str, str]] = lambda: os.environ
    observer: PluginObserver = field(default_factory=lambda: _NoObserver())

    async def __call__(
        self, repository: str, token: str = "", annotations: Mapping[str, str] | None = None
    ) -> protocol.PluginResponse:
        started = time.monotonic()
        request = protocol.encode_request(
            self.provider.api_version, repository, token=token, annotations=annotations
        )
        try:
            stdout = await self._run(repository, request)
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

    async def _run(self, repository: str, request: bytes) -> bytes:
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
                # reaped, and its pipes closed with it (a killed run left three open)
                await proc.wait()
        if proc.returncode != 0:
            raise PluginFailed(
                f"error execing credential provider plugin {name} for image {repository}: "
                f"exit status {proc.returncode}: {stderr.decode(errors='replace').strip()}"
            )
        return stdout


RunPlugin = Callable[[str, str, Mapping[str, str]], Awaitable[protocol.PluginResponse]]
"""One run of a provider's plugin for a repository, with the service account token and
annotations ("" and {} for none) (ExecPlugin; tests give their own)."""


class PluginProvider:
    """One provider: its patterns, its cache, and one run per image at a time."""

    def __init__(
        self,
        provider: CredentialProvider,
        run: RunPlugin,
        *,
        clock: Callable[[], float] = time.monotonic,
        source: AccountSource | None = None,
    ) -> None:
        self.provider = provider
        self._run = run
        self.clock = clock
        self.source = source or AccountSource()
        self.cache = protocol.CredentialCache()
        self._inflight: dict[
            tuple[str, str, tuple[tuple[str, str], ...]], asyncio.Task[protocol.PluginResponse]
        ] = {}
        self._last_purge = clock()

    async def provide(self, repository: str, pod: PullingPod | None = None) -> DockerConfig:
        """The provider's docker configuration for `repository` pulled for `pod`; {} when
        it does not match, the pod's service account cannot be used, or its plugin
        failed (logged)."""
        if not protocol.image_allowed(self.provider.match_images, repository):
            return {}
        attrs = self.provider.token_attributes
        account: _Account | None = None
        if attrs is not None and pod is not None and pod.service_account:
            try:
                account = await self._account(pod, attrs)
            except protocol.RequiredAnnotationMissing as err:
                log.debug(
                    "service account lacks a required annotation: plugin not run",
                    extra={"provider": self.provider.name, "pod": _name(pod), "error": str(err)},
                )
                return {}
            except AccountUnavailable as err:
                log.error(
                    "Failed to get service account token for credential provider",
                    extra={"provider": self.provider.name, "pod": _name(pod), "error": str(err)},
                )
                return {}
        elif attrs is not None and attrs.require_service_account:
            log.debug(
                "pod has no service account and the provider requires one: plugin not run",
                extra={"provider": self.provider.name, "pod": _name(pod) if pod else ""},
            )
            return {}
        token = account.token if account else ""
        annotations = dict(account.annotations) if account else {}
        account_key = account.cache_key if account else ""
        now = self.clock()
        if now - self._last_purge > CACHE_PURGE_INTERVAL_S:
            self.cache.purge(now)
            self._last_purge = now
        cached = self.cache.get(repository, now, account_key)
        if cached is not None:
            return cached
        flight = (repository, protocol.token_hash(token), tuple(sorted(annotations.items())))
        task = self._inflight.get(flight)
        if task is None:
            task = asyncio.ensure_future(self._run(repository, token, annotations))
            self._inflight[flight] = task
            task.add_done_callback(lambda t: self._finished(flight, t))
        try:
            response = await asyncio.shield(task)
        except (PluginFailed, OSError) as err:
            log.warning(
                "Failed getting credential from external registry credential provider",
                extra={"provider": self.provider.name, "image": repository, "error": str(err)},
            )
            return {}
        if (
            attrs is not None
            and attrs.cache_type != "Token"
            and protocol.echoes_token(response, token)
        ):
            log.error(
                "Credential provider plugin returned the service account token as the "
                "password, which is not allowed when its cacheType is not Token",
                extra={"provider": self.provider.name, "image": repository},
            )
            return {}
        expiry = protocol.expires_at(response, self.provider.default_cache_duration, self.clock())
        if expiry is not None:
            key = protocol.cache_key(response.cache_key_type, repository)
            self.cache.put(key, response.auth, expiry, account_key)
        return response.auth

    async def _account(self, pod: PullingPod, attrs: TokenAttributes) -> _Account:
        """The pod's service account token and annotations for this provider."""
        accounts, tokens = self.source.accounts, self.source.tokens
        if accounts is None or tokens is None:
            raise AccountUnavailable(
                "cannot get ServiceAccounts when kubelet is in standalone mode"
            )
        where = f"{pod.namespace}/{pod.service_account}"
        try:
            sa = await accounts.get_service_account(pod.namespace, pod.service_account)
        except ObjectUnavailable as err:
            raise AccountUnavailable(f"failed to get service account {where}: {err}") from err
        if sa is None:
            raise AccountUnavailable(f'serviceaccounts "{pod.service_account}" not found')
        meta = sa.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        annotations = protocol.service_account_annotations(
            {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            required=attrs.required_annotation_keys,
            optional=attrs.optional_annotation_keys,
        )
        bound: JSON = {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}}
        try:
            token, _ = await tokens.token(
                bound,
                service_account=pod.service_account,
                audience=attrs.audience,
                expiration_s=TOKEN_EXPIRATION_S,
                service_account_uid=uid,
            )
        except TokenError as err:
            raise AccountUnavailable(f"error getting service account token {where}: {err}") from err
        key = protocol.service_account_cache_key(
            namespace=pod.namespace,
            name=pod.service_account,
            uid=uid,
            annotations=annotations,
            cache_type=attrs.cache_type,
            token=token,
        )
        return _Account(token, annotations, key)

    def _finished(
        self,
        flight: tuple[str, str, tuple[tuple[str, str], ...]],
        task: asyncio.Task[protocol.PluginResponse],
    ) -> None:
        self._inflight.pop(flight, None)
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have been cancelled


class PluginKeyring:
    """Every configured provider, looked up together (a `images.PluginCredentials`)."""

    def __init__(self, providers: list[PluginProvider]) -> None:
        self.providers = providers

    @classmethod
    def from_config(
        cls,
        config: CredentialProviderConfig,
        *,
        observer: PluginObserver | None = None,
        source: AccountSource | None = None,
    ) -> PluginKeyring:
        log.info(
            "credential provider plugins registered",
            extra={"providers": describe(config.providers), "bin_dir": str(config.bin_dir)},
        )
        return cls(
            [
                PluginProvider(
                    p,
                    ExecPlugin(p, config.bin_dir, observer=observer or _NoObserver()),
                    source=source,
                )
                for p in config.providers
            ]
        )

    async def lookup(self, repository: str, pod: JSON | None = None) -> list[AuthConfig]:
        """Credentials for `repository` pulled for `pod` from every provider, most
        specific pattern first."""
        pulling = PullingPod.of(pod) if pod is not None else None
        configs = [await p.provide(repository, pulling) for p in self.providers]
        return Keyring(configs).lookup(repository)


def _name(pod: PullingPod) -> str:
    return f"{pod.namespace}/{pod.name}"

"""The exec credential provider protocol and its cache, as upstream's plugin provider (pure).

A provider configured in `--image-credential-provider-config` is asked for an image's
credentials only when the image's repository matches one of its `matchImages` (the same
glob rule as docker configurations: same port, as many host parts, each a glob, the
pattern's path a prefix). The request is a CredentialProviderRequest JSON on the
plugin's stdin, `{"apiVersion", "kind", "image"}`, with the repository as the image
(upstream looks the keyring up by repository, so `:tag` and `@digest` never reach it).

The response must be a CredentialProviderResponse of the provider's own apiVersion,
decoded strictly as upstream does (an unknown field is an error). Its `auth` is a docker
configuration keyed by match patterns; `cacheKeyType` says what the answer is good for:
`Image` (this repository), `Registry` (every image of its host[:port]) or `Global`
(every image the plugin matches). It is kept for `cacheDuration`, or the provider's
`defaultCacheDuration` when the response has none; a duration of 0 is not cached. A
lookup tries the image's key, then its registry's, then the global one.

A provider with `tokenAttributes` is given the pulling pod's service account token
(`serviceAccountToken`) and the service account's annotations the provider names
(`serviceAccountAnnotations`: every required key must be there, or the plugin is not
run; optional ones when present). Its answers are cached per service account, as
upstream's: the cache key adds the namespace, name, UID and those annotations, and for
`cacheType: Token` the token's hash too (so a new token asks again). With any other
cache type an answer whose password is the token itself is refused: a registry that
takes the token as the password must be cached per token.

Time is an argument everywhere; the exec, its timeout and concurrency live in
credentialplugins.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from klet.cri.types import AuthConfig
from klet.model.units import parse_duration
from klet.syncloop.containers.keyring import DockerConfig, urls_match

GLOBAL_CACHE_KEY = "<global>"  # angle brackets: never an image or registry name
CACHE_KEY_TYPES = ("Image", "Registry", "Global")
REQUEST_KIND = "CredentialProviderRequest"
RESPONSE_KIND = "CredentialProviderResponse"
_RESPONSE_FIELDS = {"kind", "apiVersion", "cacheKeyType", "cacheDuration", "auth"}


class ResponseError(ValueError):
    """A plugin's answer that cannot be used; the message never quotes credentials."""


@dataclass(frozen=True)
class PluginResponse:
    cache_key_type: str
    cache_duration: float | None  # seconds; None = the provider's default
    auth: DockerConfig


def image_allowed(match_images: Sequence[str], repository: str) -> bool:
    """Whether a provider with these patterns is asked about `repository`."""
    return any(urls_match(pattern, repository) for pattern in match_images)


def registry(repository: str) -> str:
    """The host[:port] of a repository (its first path element), upstream's parseRegistry."""
    return repository.split("/", 1)[0]


def encode_request(
    api_version: str,
    repository: str,
    *,
    token: str = "",
    annotations: Mapping[str, str] | None = None,
) -> bytes:
    """The CredentialProviderRequest; the token and annotations are left out when empty."""
    request: dict[str, object] = {
        "apiVersion": api_version,
        "kind": REQUEST_KIND,
        "image": repository,
    }
    if token:
        request["serviceAccountToken"] = token
    if annotations:
        request["serviceAccountAnnotations"] = dict(annotations)
    return json.dumps(request).encode()


class RequiredAnnotationMissing(LookupError):
    """The service account lacks an annotation the provider requires: the plugin is not run."""


def service_account_annotations(
    annotations: Mapping[str, str], *, required: Sequence[str], optional: Sequence[str]
) -> dict[str, str]:
    """The annotations passed to the plugin: every required key (else
    RequiredAnnotationMissing naming it) and the optional keys that are present."""
    chosen: dict[str, str] = {}
    for key in required:
        if key not in annotations:
            raise RequiredAnnotationMissing(f"required annotation {key} not found")
        chosen[key] = annotations[key]
    for key in optional:
        if key in annotations:
            chosen[key] = annotations[key]
    return chosen


def token_hash(token: str) -> str:
    return f"sha256:{hashlib.sha256(token.encode()).hexdigest()}" if token else ""


def service_account_cache_key(
    *,
    namespace: str,
    name: str,
    uid: str,
    annotations: Mapping[str, str],
    cache_type: str,
    token: str,
) -> str:
    """The part of a cache key that names the service account (upstream's fields: the
    token's hash only for cacheType Token). Unambiguous: a JSON array."""
    parts: list[object] = [namespace, name, uid, sorted(annotations.items())]
    if cache_type == "Token":
        parts += ["token", token_hash(token)]
    return json.dumps(parts)


def echoes_token(response: PluginResponse, token: str) -> bool:
    """Whether an answer uses the service account token itself as a password."""
    return bool(token) and any(a.password == token for a in response.auth.values())


def decode_response(data: bytes, api_version: str) -> PluginResponse:
    """Parse a plugin's stdout. Raises ResponseError naming what is wrong."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ResponseError(
            "error decoding credential provider plugin response from stdout"
        ) from None
    if not isinstance(raw, dict):
        raise ResponseError("error decoding credential provider plugin response from stdout")
    if raw.get("apiVersion") != api_version:
        raise ResponseError(
            "apiVersion from credential plugin response did not match expected apiVersion:"
            f"{api_version}, actual apiVersion:{raw.get('apiVersion')}"
        )
    if raw.get("kind") != RESPONSE_KIND:
        raise ResponseError(
            f"failed to decode CredentialProviderResponse, unexpected Kind: {raw.get('kind')!r}"
        )
    unknown = sorted(set(raw) - _RESPONSE_FIELDS)
    if unknown:
        raise ResponseError(f"unknown field in CredentialProviderResponse: {', '.join(unknown)}")
    key_type = raw.get("cacheKeyType")
    if key_type not in CACHE_KEY_TYPES:
        raise ResponseError(
            f"credential provider plugin did not return a valid cacheKeyType: {key_type!r}"
        )
    duration: float | None = None
    if raw.get("cacheDuration") is not None:
        try:
            duration = parse_duration(raw["cacheDuration"])
        except ValueError as err:
            raise ResponseError(f"cacheDuration: {err}") from None
    auth = raw.get("auth") or {}
    if not isinstance(auth, dict):
        raise ResponseError("auth must be an object of match pattern to credentials")
    config: DockerConfig = {}
    for pattern, entry in auth.items():
        if not isinstance(entry, dict) or set(entry) - {"username", "password"}:
            raise ResponseError(f"auth[{pattern!r}] must hold only username and password")
        config[str(pattern)] = AuthConfig(
            username=str(entry.get("username") or ""), password=str(entry.get("password") or "")
        )
    return PluginResponse(str(key_type), duration, config)


def cache_key(key_type: str, repository: str) -> str:
    """Where an answer of this cacheKeyType is kept."""
    if key_type == "Image":
        return repository
    if key_type == "Registry":
        return registry(repository)
    return GLOBAL_CACHE_KEY


def expires_at(response: PluginResponse, default: float, now: float) -> float | None:
    """When a cached answer expires; None = do not cache (a duration of 0, given or
    defaulted)."""
    duration = default if response.cache_duration is None else response.cache_duration
    return now + duration if duration > 0 else None


class CredentialCache:
    """Answers by cache key (and service account key, "" for none) until they expire;
    expired ones are dropped when looked at and by `purge` (upstream purges every 15
    minutes)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[DockerConfig, float]] = {}

    def get(self, repository: str, now: float, account: str = "") -> DockerConfig | None:
        for base in (repository, registry(repository), GLOBAL_CACHE_KEY):
            key = (base, account)
            entry = self._entries.get(key)
            if entry is None:
                continue
            if now > entry[1]:
                del self._entries[key]
                continue
            return entry[0]
        return None

    def put(
        self, key: str, config: Mapping[str, AuthConfig], expiry: float, account: str = ""
    ) -> None:
        self._entries[(key, account)] = (dict(config), expiry)

    def purge(self, now: float) -> None:
        for key in [k for k, (_, expiry) in self._entries.items() if now > expiry]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

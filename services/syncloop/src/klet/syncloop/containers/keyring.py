"""Registry credentials for an image, as upstream's credentialprovider finds them (pure).

Sources are docker configurations: the `auths` of a `kubernetes.io/dockerconfigjson`
secret or a docker `config.json`, and the plain map of a `kubernetes.io/dockercfg`
secret or a legacy `.dockercfg` file. Each entry is keyed by a registry location —
`host[:port][/path]`, with or without an `http(s)://` scheme, `/v1/` or `/v2/` in front
of the path meaning the bare host — and holds a username and password, or `auth`, the
base64 of `user:password`.

Matching follows upstream's keyring: the image is normalised to its repository
(`busybox` → `docker.io/library/busybox`, `index.docker.io` → `docker.io`); a location
matches when the ports are equal, the host has as many dot-separated parts as the
image's, each part matches as a glob (`*.example.com`), and the location's path is a
prefix of the image's. Locations are tried in reverse lexical order, so the most
specific (`quay.io/team`) comes before its host (`quay.io`). Only when nothing matches
do credentials for `index.docker.io` apply to Docker Hub images. The pod's pull secrets
form one keyring and the node's configuration another; the secrets' credentials come
first, and an image no credential matches is pulled anonymously.

Everything here is pure: the files are read by the caller (`images.NodeCredentials`)
through the `read` function `node_docker_config` is given.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from klet.cri.types import AuthConfig
from klet.model.types import JSON

DockerConfig = dict[str, AuthConfig]
"""Registry location → credentials, as one docker configuration holds them."""

DEFAULT_REGISTRY_HOST = "index.docker.io"
DOCKER_HUB = "docker.io"

SECRET_TYPE_DOCKER_CONFIG_JSON = "kubernetes.io/dockerconfigjson"
SECRET_TYPE_DOCKERCFG = "kubernetes.io/dockercfg"
DOCKER_CONFIG_JSON_KEY = ".dockerconfigjson"
DOCKERCFG_KEY = ".dockercfg"
CONFIG_JSON_FILE = "config.json"
DOCKERCFG_FILE = ".dockercfg"


class KeyringError(ValueError):
    """A docker configuration or an image name that cannot be parsed."""


# -- image names (the docker reference grammar) ----------------------------------------

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_REFERENCE = re.compile(
    rf"^({_NAME})(?::([\w][\w.-]{{0,127}}))?(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*"
    r":[0-9a-fA-F]{32,}))?$"
)
_HEX64 = re.compile(r"^[a-f0-9]{64}$")


@dataclass(frozen=True)
class ImageName:
    """A parsed image reference: `repository` is normalised (`docker.io/library/x`)."""

    repository: str
    tag: str = ""
    digest: str = ""


def parse_image(image: str) -> ImageName:
    """Parse and normalise an image reference as upstream's ParseNormalizedNamed does."""
    if _HEX64.match(image):
        raise KeyringError(
            f"invalid repository name ({image}), cannot specify 64-byte hexadecimal strings"
        )
    first, slash, rest = image.partition("/")
    if not slash or (
        not any(ch in first for ch in ".:") and first != "localhost" and first.lower() == first
    ):
        domain, remainder = DOCKER_HUB, image
    else:
        domain, remainder = first, rest
    if domain == DEFAULT_REGISTRY_HOST:
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and "/" not in remainder:
        remainder = f"library/{remainder}"
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        raise KeyringError(
            f"invalid reference format: repository name ({remote}) must be lowercase"
        )
    match = _REFERENCE.match(f"{domain}/{remainder}")
    if match is None:
        raise KeyringError("invalid reference format")
    return ImageName(
        repository=match.group(1), tag=match.group(2) or "", digest=match.group(3) or ""
    )


def with_default_tag(image: str) -> str:
    """`image` with `:latest` appended when it has neither tag nor digest (upstream)."""
    try:
        parsed = parse_image(image)
    except KeyringError as err:
        raise KeyringError(f'couldn\'t parse image name "{image}": {err}') from err
    return image if parsed.tag or parsed.digest else f"{image}:latest"


# -- docker configurations -------------------------------------------------------------


def decode_auth(field: str) -> tuple[str, str]:
    """The (username, password) of an `auth` field: base64, padded or not, of `user:pass`."""
    text = field.strip()
    try:
        decoded = base64.b64decode(text + "=" * (-len(text) % 4), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as err:
        raise KeyringError(f"illegal base64 data in auth field: {err}") from err
    user, colon, password = decoded.partition(":")
    if not colon:
        raise KeyringError(
            "unable to parse auth field, must be formatted as base64(username:password)"
        )
    return user, password


def _entry(raw: Any) -> AuthConfig:
    if not isinstance(raw, dict):
        raise KeyringError("a docker config entry must be an object")
    # Go's encoding/json matches field names case-insensitively; so does this.
    fields = {str(k).lower(): v for k, v in raw.items()}
    auth = str(fields.get("auth") or "")
    if auth:
        user, password = decode_auth(auth)
        return AuthConfig(username=user, password=password)
    return AuthConfig(
        username=str(fields.get("username") or ""), password=str(fields.get("password") or "")
    )


def _json(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise KeyringError("error occurred while trying to unmarshal json") from err


def parse_dockercfg(data: bytes | str) -> DockerConfig:
    """A `.dockercfg` (a map of registry location → entry)."""
    raw = _json(data)
    if not isinstance(raw, dict):
        raise KeyringError("a .dockercfg must be a JSON object")
    return {str(loc): _entry(entry) for loc, entry in raw.items()}


def parse_config_json(data: bytes | str) -> DockerConfig:
    """A docker `config.json` or `.dockerconfigjson`: its `auths`."""
    raw = _json(data)
    if not isinstance(raw, dict):
        raise KeyringError("a docker config.json must be a JSON object")
    auths = raw.get("auths") or {}
    if not isinstance(auths, dict):
        raise KeyringError("auths must be a JSON object")
    return {str(loc): _entry(entry) for loc, entry in auths.items()}


def secret_docker_config(secret: JSON) -> DockerConfig | None:
    """The docker configuration of a pull secret (API JSON, `data` base64), or None when
    the secret is of another type or lacks its key, which upstream ignores."""
    kind = secret.get("type")
    data = secret.get("data") or {}
    key, parse = {
        SECRET_TYPE_DOCKER_CONFIG_JSON: (DOCKER_CONFIG_JSON_KEY, parse_config_json),
        SECRET_TYPE_DOCKERCFG: (DOCKERCFG_KEY, parse_dockercfg),
    }.get(str(kind), ("", parse_dockercfg))
    encoded = data.get(key) if key else None
    if not encoded:
        return None
    try:
        payload = base64.b64decode(str(encoded), validate=True)
    except binascii.Error as err:
        raise KeyringError(f"{key} is not base64: {err}") from err
    return parse(payload) if payload else None


def docker_config_paths(
    root_dir: Path, *, cwd: Path, home: Path
) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """Where the node's docker configuration may be, in upstream's order: `config.json`
    in the kubelet root dir, the working dir, `$HOME/.docker` and `/.docker`; else a
    `.dockercfg` in the root dir, the working dir, `$HOME` and `/`."""
    root = Path("/")
    json_dirs = (root_dir, cwd, home / ".docker", root / ".docker")
    cfg_dirs = (root_dir, cwd, home, root)
    return (
        tuple(d / CONFIG_JSON_FILE for d in json_dirs),
        tuple(d / DOCKERCFG_FILE for d in cfg_dirs),
    )


def node_docker_config(
    paths: tuple[Sequence[Path], Sequence[Path]], read: Callable[[Path], bytes | None]
) -> DockerConfig:
    """The first `config.json` that reads and parses, else the first `.dockercfg`, else
    nothing; `read` returns a file's bytes or None when it cannot be read."""
    json_paths, cfg_paths = paths
    for parse, candidates in ((parse_config_json, json_paths), (parse_dockercfg, cfg_paths)):
        for path in candidates:
            data = read(path)
            if data is None:
                continue
            try:
                return parse(data)
            except KeyringError:
                continue
    return {}


# -- matching --------------------------------------------------------------------------


def _location_key(location: str) -> str | None:
    value = location if location.startswith(("https://", "http://")) else f"https://{location}"
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    host = parts.netloc.rpartition("@")[2]
    path = parts.path
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return host + path if path and path != "/" else host


def _split(url: str) -> tuple[list[str], str, str]:
    parts = urlsplit(f"https://{url}")
    host, port = parts.netloc, ""
    head, colon, tail = host.rpartition(":")
    if colon and tail.isdigit() and "]" not in tail:
        host, port = head, tail
    return host.split("."), port, parts.path


def urls_match(glob: str, target: str) -> bool:
    """Whether credentials for location `glob` apply to repository `target` (both
    without scheme): same port, same number of host parts, each part a glob match, and
    the glob's path a prefix of the target's."""
    try:
        glob_parts, glob_port, glob_path = _split(glob)
        target_parts, target_port, target_path = _split(target)
    except ValueError:
        return False
    if glob_port != target_port or len(glob_parts) != len(target_parts):
        return False
    if not target_path.startswith(glob_path):
        return False
    return all(fnmatch.fnmatchcase(t, g) for g, t in zip(glob_parts, target_parts, strict=True))


def _is_default_registry(repository: str) -> bool:
    first, slash, _ = repository.partition("/")
    if not first:
        return False
    if not slash or first in (DOCKER_HUB, DEFAULT_REGISTRY_HOST):
        return True
    return not any(ch in first for ch in ".:")


class Keyring:
    """Credentials by registry location, from one or more docker configurations."""

    def __init__(self, configs: Iterable[Mapping[str, AuthConfig]] = ()) -> None:
        self._creds: dict[str, list[AuthConfig]] = {}
        for config in configs:
            self.add(config)

    def add(self, config: Mapping[str, AuthConfig]) -> None:
        for location, auth in config.items():
            key = _location_key(location)
            if key is not None:
                self._creds.setdefault(key, []).append(auth)

    def lookup(self, repository: str) -> list[AuthConfig]:
        """Every credential for `repository` (a normalised name), most specific first."""
        found = [
            auth
            for key in sorted(self._creds, reverse=True)
            if urls_match(key, repository)
            for auth in self._creds[key]
        ]
        if not found and _is_default_registry(repository):
            found = list(self._creds.get(DEFAULT_REGISTRY_HOST, ()))
        return found


def pull_credentials(
    image: str, *, secrets: Sequence[DockerConfig], node: Mapping[str, AuthConfig]
) -> list[AuthConfig]:
    """The credentials to try, in order, for pulling `image`: those of the pod's pull
    secrets (one keyring for all of them), then the node's; empty = pull anonymously."""
    repository = parse_image(image).repository
    return Keyring(secrets).lookup(repository) + Keyring([node]).lookup(repository)

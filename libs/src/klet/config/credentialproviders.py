"""The CredentialProviderConfig of `--image-credential-provider-config`, read and checked.

Upstream's kubelet reads this file (or every `*.json`, `*.yaml`, `*.yml` file of a
directory, in lexical order, merged) at start-up, decodes it strictly, validates it and
finds each provider's executable in `--image-credential-provider-bin-dir`; any problem
stops the kubelet. klet does the same at settings time, so `klet up` and every service
refuse a bad file before anything runs, and lists every problem at once, each naming the
file and the field (`creds.yaml: providers[0].defaultCacheDuration: required`).

Versions are upstream 1.34's: the file may be `kubelet.config.k8s.io/v1`, `v1beta1` or
`v1alpha1` (the three decode to the same fields), and each provider's `apiVersion` (the
version of the CredentialProviderRequest/Response it speaks) one of
`credentialprovider.kubelet.k8s.io/v1`, `v1beta1`, `v1alpha1`.

A provider's `tokenAttributes` (KEP-4412, gate KubeletServiceAccountTokenForCredentialProviders,
on by default in 1.34) asks for a token of the pulling pod's service account, bound to
the pod with the provider's audience, to be passed to the plugin. As upstream it exists
only in the `kubelet.config.k8s.io/v1` file (an unknown field in the older two) and only
for providers speaking `credentialprovider.kubelet.k8s.io/v1`; the audience,
`requireServiceAccount` and `cacheType` (`Token` or `ServiceAccount`) are required,
annotation keys must be qualified names, listed once, never both required and optional,
and required keys need `requireServiceAccount: true`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from klet.config.errors import Problem
from klet.model.podvalidation import is_dns1123_subdomain
from klet.model.units import parse_duration

__all__ = [
    "CONFIG_API_VERSIONS",
    "KIND",
    "PLUGIN_API_VERSIONS",
    "CredentialProvider",
    "CredentialProviderConfig",
    "TokenAttributes",
    "decode_credential_provider_config",
    "describe",
    "load_credential_providers",
    "match_image_problem",
]

KIND = "CredentialProviderConfig"
CONFIG_API_VERSIONS = (
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
)
PLUGIN_API_VERSIONS = (
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
)
_CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
_PROVIDER_FIELDS = {"name", "matchImages", "defaultCacheDuration", "apiVersion", "args", "env"}
# tokenAttributes is a field of the v1 file only (upstream's older two have no such field)
_TOKEN_CONFIG_VERSION = "kubelet.config.k8s.io/v1"
_TOKEN_PLUGIN_VERSION = "credentialprovider.kubelet.k8s.io/v1"
_TOKEN_FIELDS = {
    "serviceAccountTokenAudience",
    "cacheType",
    "requireServiceAccount",
    "requiredServiceAccountAnnotationKeys",
    "optionalServiceAccountAnnotationKeys",
}
CACHE_TYPES = ("ServiceAccount", "Token")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_QUALIFIED_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")


@dataclass(frozen=True)
class TokenAttributes:
    """A provider's tokenAttributes: the pod's service account token it is given."""

    audience: str
    cache_type: str  # "Token": cached per token; "ServiceAccount": per service account
    require_service_account: bool
    required_annotation_keys: tuple[str, ...] = ()
    optional_annotation_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class CredentialProvider:
    """One exec plugin: `name` is its executable in the bin dir."""

    name: str
    match_images: tuple[str, ...]  # globs in the host, never in port or path
    default_cache_duration: float  # seconds; used when a response has no cacheDuration
    api_version: str  # of the request/response it speaks
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # added to the kubelet's environment
    token_attributes: TokenAttributes | None = None


@dataclass(frozen=True)
class CredentialProviderConfig:
    """The providers, in the order upstream registers them, and where they live."""

    providers: tuple[CredentialProvider, ...]
    bin_dir: Path
    files: tuple[Path, ...] = field(default=())
    # sha256 of the files' contents, each prefixed by its length (uint64, big-endian),
    # as upstream computes it for kubelet_credential_provider_config_info{hash}
    hash: str = ""


def match_image_problem(pattern: str) -> str | None:
    """Why a matchImages entry does not parse as a schemeless URL, or None."""
    if _CONTROL.search(pattern):
        return "match image is invalid: it may not contain spaces or control characters"
    try:
        parts = urlsplit(f"https://{pattern}")
        parts.port  # noqa: B018 -- a non-numeric port raises here
    except ValueError as err:
        return f"match image is invalid: {err}"
    if not parts.hostname and not parts.netloc:
        return "match image is invalid: no host"
    return None


def _valid_name(name: str) -> bool:
    """A provider name that is a file name in the bin dir (upstream's rules)."""
    return bool(name) and "/" not in name and " " not in name and name not in (".", "..")


def _strings(raw: object, where: str, problems: list[Problem]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        problems.append(Problem(where, "must be a list of strings"))
        return ()
    return tuple(raw)


def _qualified_name_problem(key: str) -> str | None:
    """Why an annotation key is not a qualified name (case ignored, as upstream), or None."""
    prefix, slash, name = key.lower().rpartition("/")
    if slash and (not prefix or not is_dns1123_subdomain(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            "name part must be at most 63 characters of alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return None


def _token_attributes(
    raw: object, api_version: object, where: str, problems: list[Problem]
) -> TokenAttributes | None:
    """A provider's tokenAttributes checked as upstream's validateCredentialProviderConfig."""
    if not isinstance(raw, Mapping):
        problems.append(Problem(where, "must be an object"))
        return None
    for key in sorted(set(raw) - _TOKEN_FIELDS, key=str):
        problems.append(Problem(f"{where}.{key}", "unknown field"))
    audience = raw.get("serviceAccountTokenAudience")
    if not isinstance(audience, str) or not audience:
        problems.append(Problem(f"{where}.serviceAccountTokenAudience", "required"))
        audience = ""
    require = raw.get("requireServiceAccount")
    if require is None:
        problems.append(Problem(f"{where}.requireServiceAccount", "required"))
    elif not isinstance(require, bool):
        problems.append(Problem(f"{where}.requireServiceAccount", "must be true or false"))
        require = None
    if api_version != _TOKEN_PLUGIN_VERSION:
        problems.append(
            Problem(
                where, f"tokenAttributes is only supported for {_TOKEN_PLUGIN_VERSION} API version"
            )
        )
    required = _strings(
        raw.get("requiredServiceAccountAnnotationKeys"),
        f"{where}.requiredServiceAccountAnnotationKeys",
        problems,
    )
    optional = _strings(
        raw.get("optionalServiceAccountAnnotationKeys"),
        f"{where}.optionalServiceAccountAnnotationKeys",
        problems,
    )
    if require is False and required:
        problems.append(
            Problem(
                f"{where}.requiredServiceAccountAnnotationKeys",
                "requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys "
                "is set",
            )
        )
    for name, keys in (
        ("requiredServiceAccountAnnotationKeys", required),
        ("optionalServiceAccountAnnotationKeys", optional),
    ):
        seen: set[str] = set()
        for key in keys:
            why = _qualified_name_problem(key)
            if why:
                problems.append(Problem(f"{where}.{name}", f'"{key}": {why}'))
            if key in seen:
                problems.append(Problem(f"{where}.{name}", f'"{key}": duplicate value'))
            seen.add(key)
    both = sorted(set(required) & set(optional))
    if both:
        problems.append(
            Problem(where, f"{both}: annotation keys cannot be both required and optional")
        )
    cache_type = raw.get("cacheType")
    if not cache_type:
        problems.append(
            Problem(
                f"{where}.cacheType",
                "cacheType is required to be set when tokenAttributes is specified. "
                f"Supported values are: {', '.join(CACHE_TYPES)}",
            )
        )
    elif cache_type not in CACHE_TYPES:
        supported = ", ".join(f'"{v}"' for v in CACHE_TYPES)
        problems.append(
            Problem(
                f"{where}.cacheType", f"Unsupported value: {cache_type!r}: supported {supported}"
            )
        )
    if not isinstance(cache_type, str) or require is None:
        return None
    return TokenAttributes(
        audience=audience,
        cache_type=cache_type,
        require_service_account=require,
        required_annotation_keys=required,
        optional_annotation_keys=optional,
    )


def _provider(
    raw: object, where: str, problems: list[Problem], *, config_version: object = None
) -> CredentialProvider | None:
    if not isinstance(raw, Mapping):
        problems.append(Problem(where, "must be an object"))
        return None
    fields = _PROVIDER_FIELDS | (
        {"tokenAttributes"} if config_version == _TOKEN_CONFIG_VERSION else set()
    )
    for key in sorted(set(raw) - fields, key=str):
        problems.append(Problem(f"{where}.{key}", "unknown field"))
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem(f"{where}.name", "required"))
        name = ""
    elif not _valid_name(name):
        problems.append(
            Problem(f"{where}.name", f'"{name}": may not contain "/" or spaces, nor be . or ..')
        )
    api_version = raw.get("apiVersion")
    if not api_version:
        problems.append(Problem(f"{where}.apiVersion", "required"))
    elif api_version not in PLUGIN_API_VERSIONS:
        supported = ", ".join(f'"{v}"' for v in sorted(PLUGIN_API_VERSIONS))
        problems.append(
            Problem(
                f"{where}.apiVersion", f"Unsupported value: {api_version!r}: supported {supported}"
            )
        )
    images = _strings(raw.get("matchImages"), f"{where}.matchImages", problems)
    if not images:
        problems.append(
            Problem(f"{where}.matchImages", "at least 1 item in matchImages is required")
        )
    for i, pattern in enumerate(images):
        why = match_image_problem(pattern)
        if why:
            problems.append(Problem(f"{where}.matchImages[{i}]", f'"{pattern}": {why}'))
    duration = 0.0
    raw_duration = raw.get("defaultCacheDuration")
    if raw_duration is None:
        problems.append(Problem(f"{where}.defaultCacheDuration", "required"))
    else:
        try:
            duration = parse_duration(raw_duration)
        except ValueError as err:
            problems.append(Problem(f"{where}.defaultCacheDuration", str(err)))
        if duration < 0:
            problems.append(
                Problem(f"{where}.defaultCacheDuration", "must be greater than or equal to 0")
            )
    args = _strings(raw.get("args"), f"{where}.args", problems)
    env: list[tuple[str, str]] = []
    raw_env = raw.get("env") or []
    if not isinstance(raw_env, list):
        problems.append(Problem(f"{where}.env", "must be a list of name and value objects"))
        raw_env = []
    for j, var in enumerate(raw_env):
        at = f"{where}.env[{j}]"
        if not isinstance(var, Mapping):
            problems.append(Problem(at, "must be an object with name and value"))
            continue
        for key in sorted(set(var) - {"name", "value"}, key=str):
            problems.append(Problem(f"{at}.{key}", "unknown field"))
        if not isinstance(var.get("name"), str) or not var.get("name"):
            problems.append(Problem(f"{at}.name", "required"))
            continue
        env.append((var["name"], str(var.get("value") or "")))
    token: TokenAttributes | None = None
    if "tokenAttributes" in fields and raw.get("tokenAttributes") is not None:
        token = _token_attributes(
            raw["tokenAttributes"], api_version, f"{where}.tokenAttributes", problems
        )
    if not isinstance(api_version, str) or not isinstance(name, str):
        return None
    return CredentialProvider(
        name=name,
        match_images=images,
        default_cache_duration=max(duration, 0.0),
        api_version=api_version,
        args=args,
        env=tuple(env),
        token_attributes=token,
    )


def decode_credential_provider_config(
    data: object,
) -> tuple[list[CredentialProvider], list[Problem]]:
    """The providers of one decoded file and its problems (field paths, unprefixed)."""
    if not isinstance(data, Mapping):
        return [], [Problem("", "must be a CredentialProviderConfig object")]
    problems: list[Problem] = []
    if data.get("kind") != KIND:
        problems.append(Problem("kind", f'must be "{KIND}", got {json.dumps(data.get("kind"))}'))
    if data.get("apiVersion") not in CONFIG_API_VERSIONS:
        supported = ", ".join(CONFIG_API_VERSIONS)
        problems.append(
            Problem("apiVersion", f"{json.dumps(data.get('apiVersion'))}: supported {supported}")
        )
    for key in sorted(set(data) - {"kind", "apiVersion", "providers"}, key=str):
        problems.append(Problem(key, "unknown field"))
    raw_providers = data.get("providers")
    if raw_providers is not None and not isinstance(raw_providers, list):
        return [], [*problems, Problem("providers", "must be a list")]
    providers: list[CredentialProvider] = []
    for i, raw in enumerate(raw_providers or []):
        provider = _provider(
            raw, f"providers[{i}]", problems, config_version=data.get("apiVersion")
        )
        if provider is not None:
            providers.append(provider)
    return providers, problems


def _parse(path: Path, text: str) -> object:
    if path.suffix.lower() == ".json":
        return json.loads(text)
    from klet.config.yamltext import parse_yaml  # PyYAML only when a YAML file is read

    data, duplicates = parse_yaml(text)
    if duplicates:
        raise ValueError("; ".join(duplicates))
    return data


def _config_files(path: Path) -> tuple[list[Path], Problem | None]:
    if not path.exists():
        return [], Problem(str(path), "unable to access path: no such file or directory")
    if not path.is_dir():
        return [path], None
    files = sorted(p for p in path.iterdir() if p.suffix in _CONFIG_SUFFIXES and not p.is_dir())
    if not files:
        return [], Problem(str(path), "no configuration files (*.json, *.yaml, *.yml) found")
    return files, None


def load_credential_providers(
    config: Path,
    bin_dir: Path,
    *,
    executable: Callable[[Path], bool] = lambda p: p.is_file() and os.access(p, os.X_OK),
) -> tuple[CredentialProviderConfig | None, list[Problem]]:
    """Read `config` (a file or a directory of them), validate it and find each
    provider's executable in `bin_dir`. Problems name the file (or directory) and field."""
    problems: list[Problem] = []
    if not bin_dir.is_dir():
        problems.append(
            Problem(
                "--image-credential-provider-bin-dir",
                f"plugin binary directory {bin_dir} did not exist",
            )
        )
    files, missing = _config_files(config)
    if missing is not None:
        return None, [*problems, missing]
    providers: list[CredentialProvider] = []
    seen: dict[str, Path] = {}
    digest = hashlib.sha256()
    for file in files:
        try:
            raw = file.read_bytes()
            digest.update(len(raw).to_bytes(8, "big") + raw)
            data = _parse(file, raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
            problems.append(Problem(str(file), f"cannot read: {err}"))
            continue
        found, file_problems = decode_credential_provider_config(data)
        problems += [
            Problem(f"{file}: {p.path}" if p.path else str(file), p.message) for p in file_problems
        ]
        for i, provider in enumerate(found):
            if provider.name in seen:
                problems.append(
                    Problem(
                        f"{file}: providers[{i}].name",
                        f'duplicate provider name "{provider.name}" '
                        f"(also in {seen[provider.name]})",
                    )
                )
                continue
            seen[provider.name] = file
            providers.append(provider)
            if (
                bin_dir.is_dir()
                and _valid_name(provider.name)
                and not executable(bin_dir / provider.name)
            ):
                problems.append(
                    Problem(
                        f"{file}: providers[{i}].name",
                        f"plugin binary executable {bin_dir / provider.name} did not exist "
                        "(or is not executable)",
                    )
                )
    if not providers and not problems:
        problems.append(Problem(str(config), "providers: at least 1 item in plugins is required"))
    if problems:
        return None, problems
    config_hash = f"sha256:{digest.hexdigest()}"
    return CredentialProviderConfig(tuple(providers), bin_dir, tuple(files), config_hash), []


def describe(providers: Sequence[CredentialProvider]) -> str:
    """The providers' names and patterns, for the start-up log line."""
    return "; ".join(
        f"{p.name} ({', '.join(p.match_images)})"
        + (
            f" with service account tokens for {p.token_attributes.audience}"
            if p.token_attributes
            else ""
        )
        for p in providers
    )

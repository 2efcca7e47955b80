"""From manifest bytes to normalised pods: decode, validate, default.

Pure (bytes in, pods or a `ManifestError` out), shared by the file and the URL source.

Decoding choices:
- JSON when the text starts with `{` (or `[`), YAML otherwise. JSON is mostly YAML,
  but PyYAML implements YAML 1.1 and trips over some valid JSON; trying JSON first
  for JSON-looking input gives the better error message too.
- YAML timestamps stay strings (`creationTimestamp: 2024-01-01T00:00:00Z` must not turn
  into a datetime that JSON cannot carry), and only JSON-representable documents are
  accepted (string keys, no NaN), so what is hashed is exactly what is published.
- One document per file; a multi-document YAML file is an error, as upstream.
- YAML goes through PyYAML's pure-Python safe loader, not the libyaml (C) one. The C
  composer recurses on the C stack: a hostile file of nested `[[[[...` or `- - - -`
  crashes the process with a segfault, and deep flow nesting makes libyaml quadratic.
  The Python loader refuses such a file with a RecursionError after a few hundred
  levels, in about a second. The price is speed (about 20 ms for a typical 2 KB
  manifest instead of 1 ms), paid once per change since the file source re-parses a
  file only when its stat changes. JSON keeps the C parser, which checks its depth.

Each error carries a reason from a closed set (`REASONS`), used as a metric label.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

import yaml
from klet.model.types import JSON
from klet.pod_source.normalize import StaticSource, normalize_static_pod
from klet.pod_source.validation import MAX_MANIFEST_BYTES, validate_pod

Reason = Literal["read", "too_large", "parse", "invalid", "duplicate"]
REASONS: Final = ("read", "too_large", "parse", "invalid", "duplicate")


class ManifestError(Exception):
    """A manifest (file or URL body) that cannot become pods, with a metric reason."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


class _Loader(yaml.SafeLoader):
    """Safe YAML loader that leaves timestamps as strings."""


# The implicit resolvers are a class-level dict shared with SafeLoader: copy before
# removing the timestamp rule so other users of PyYAML are unaffected.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:timestamp"]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def decode_document(data: bytes) -> Any:
    """The single YAML or JSON document in `data`; None for an empty or blank input."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError("too_large", f"{len(data)} bytes, more than {MAX_MANIFEST_BYTES}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ManifestError("parse", f"not UTF-8 text: {err}") from err
    stripped = text.lstrip()
    if not stripped:
        return None
    try:
        if stripped[0] in "{[":
            doc = json.loads(text)
        else:
            doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader
    except json.JSONDecodeError as err:
        raise ManifestError("parse", f"invalid JSON: {err}") from err
    except yaml.YAMLError as err:
        raise ManifestError("parse", f"invalid YAML: {_one_line(str(err))}") from err
    problem = _json_problem(doc, "<root>")
    if problem:
        raise ManifestError("parse", problem)
    return doc


def pod_from_file(data: bytes, *, path: str, node_name: str) -> JSON:
    """The one normalised Pod of a static-pod file."""
    with _depth_guard():
        doc = decode_document(data)
        if doc is None:
            raise ManifestError("parse", "empty manifest")
        return _checked_pod(doc, node_name=node_name, source="file", origin=path, where="")


def pods_from_url_body(data: bytes, *, url: str, node_name: str) -> list[JSON]:
    """The normalised pods of a URL body: a Pod, a PodList, or nothing (empty body).

    One bad item refuses the whole body, as upstream: the URL is one snapshot, and
    applying half of it would remove the pods whose entries failed.
    """
    with _depth_guard():
        return _pods_from_body(data, url=url, node_name=node_name)


def _pods_from_body(data: bytes, *, url: str, node_name: str) -> list[JSON]:
    doc = decode_document(data)
    if doc is None:
        return []
    if isinstance(doc, Mapping) and doc.get("kind") == "PodList":
        if doc.get("apiVersion") != "v1":
            raise ManifestError(
                "invalid", f"apiVersion: {doc.get('apiVersion')!r} is not supported, want 'v1'"
            )
        items = doc.get("items")
        if items is None:
            return []
        if not isinstance(items, list):
            raise ManifestError("invalid", "items: expected a list")
        return [
            _checked_pod(item, node_name=node_name, source="http", origin=url, where=f"items[{i}].")
            for i, item in enumerate(items)
        ]
    return [_checked_pod(doc, node_name=node_name, source="http", origin=url, where="")]


def _checked_pod(
    doc: Any, *, node_name: str, source: StaticSource, origin: str, where: str
) -> JSON:
    problems = validate_pod(doc, node_name=node_name)
    if problems:
        raise ManifestError("invalid", "; ".join(f"{where}{p}" for p in problems))
    return normalize_static_pod(doc, node_name=node_name, source=source, origin=origin)


@contextlib.contextmanager
def _depth_guard() -> Iterator[None]:
    """Turn a hostile nesting depth (`[[[[...]]]]`) into a parse error, not a crash.

    The parsers, the checks and the deep copy all recurse; whichever hits Python's
    recursion limit first, the document is refused rather than the source loop killed.
    """
    try:
        yield
    except RecursionError as err:
        raise ManifestError("parse", "document nested too deeply") from err


def _json_problem(value: Any, path: str) -> str | None:
    """Why `value` cannot round-trip through JSON, or None."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}: key {key!r} is not a string"
            problem = _json_problem(item, f"{path}.{key}" if path != "<root>" else key)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path}: {value} is not a JSON number"
    if value is None or isinstance(value, str | int | float | bool):
        return None
    return f"{path}: a {type(value).__name__} value cannot be represented in JSON"


def _one_line(text: str) -> str:
    return " ".join(text.split())

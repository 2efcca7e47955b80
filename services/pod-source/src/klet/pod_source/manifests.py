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

Hostile input is refused while decoding, before anything expands it:
- YAML aliases: the composed node graph is measured before any object is built. An
  alias costs nothing to parse but every later walk (validation, the canonical JSON
  hashed for the UID, the JSON published to the bus) expands it, so a few hundred
  bytes of nested aliases (a "billion laughs") become gigabytes. A document whose
  aliases would add more than `MAX_ALIAS_EXPANSION` nodes, or that refers to itself,
  is refused. Ordinary use of anchors (a shared env list) stays well below that.
- Nesting deeper than `MAX_NESTING` levels: PyYAML's scanner is quadratic in it.
- Integers: Python parses arbitrarily long numbers, and converting one of more than
  4300 digits raises a ValueError of its own. Both parsers hand long digit strings to
  us unconverted, and any integer outside int64 (the API's widest integer) is refused
  with the field that holds it.
- Strings must encode as UTF-8 (a JSON or YAML escape can produce a lone surrogate,
  which would fail later, when the pod is hashed or published).
- Anything else a parser or the normalisation raises is contained here as well: one
  bad manifest is one `ManifestError`, never an exception that ends the source loop.

Each error carries a reason from a closed set (`REASONS`), used as a metric label.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

import yaml
from klet.model.podvalidation import INT64_MAX, INT64_MIN
from klet.model.types import JSON
from klet.pod_source.normalize import StaticSource, normalize_static_pod
from klet.pod_source.validation import MAX_MANIFEST_BYTES, MAX_URL_BODY_BYTES, validate_pod

Reason = Literal["read", "too_large", "parse", "invalid", "duplicate"]
REASONS: Final = ("read", "too_large", "parse", "invalid", "duplicate")

# How many nodes YAML aliases may add to a document once expanded.
MAX_ALIAS_EXPANSION: Final = 10_000

# Deepest YAML nesting accepted (a pod is about 10 levels deep; the composer's own
# recursion would stop a little above 300).
MAX_NESTING: Final = 100

# Digit strings longer than this are not converted to int (int64 has 19 digits; the
# margin lets the range check, not the parser, report "out of range" with the field).
MAX_INT_TEXT: Final = 40


class ManifestError(Exception):
    """A manifest (file or URL body) that cannot become pods, with a metric reason."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


class _LongInt:
    """An integer literal too long to convert; refused by `_json_problem` with its path."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Loader(yaml.SafeLoader):
    """Safe YAML loader: nesting is capped while scanning, timestamps stay strings,
    aliases are measured before any object is built, long integers are not converted."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's name
        # PyYAML's scanner is quadratic in the flow nesting depth (it re-checks every
        # open level at each token): 30,000 `[` take ten seconds, a megabyte of them
        # hours. Stop at a depth no pod needs, before the scanner slows down.
        if self.flow_level >= MAX_NESTING:
            raise ManifestError("parse", _too_deep(self.get_mark()))
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) >= MAX_NESTING:
            raise ManifestError("parse", _too_deep(self.get_mark()))
        return bool(super().add_indent(column))

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_aliases(node)
        return node


# The implicit resolvers are a class-level dict shared with SafeLoader: copy before
# removing the timestamp rule so other users of PyYAML are unaffected.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:timestamp"]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _too_deep(mark: Any) -> str:
    return f"document nested deeper than {MAX_NESTING} levels (line {mark.line + 1})"


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | _LongInt:
    text = str(node.value)
    if len(text.replace("_", "")) > MAX_INT_TEXT:
        return _LongInt(text)
    return int(loader.construct_yaml_int(node))


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _json_int(text: str) -> int | _LongInt:
    return _LongInt(text) if len(text) > MAX_INT_TEXT else int(text)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_aliases(root: yaml.Node) -> None:
    """Refuse a node graph that refers to itself or that aliases would blow up.

    Two linear walks over the distinct nodes: count them, then compute each node's
    expanded size (memoised, so shared nodes are visited once) and stop as soon as the
    expansion passes the allowance. Iterative: the composer already bounds the depth,
    and this must not add a recursion of its own.
    """
    distinct: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) not in distinct:
            distinct.add(id(node))
            pending.extend(_children(node))
    if len(distinct) <= 1:
        return
    limit = len(distinct) + MAX_ALIAS_EXPANSION
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            visiting.discard(key)
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > limit:
                raise ManifestError(
                    "parse",
                    f"YAML aliases expand the document beyond {limit} nodes "
                    f"(line {node.start_mark.line + 1}); refusing it",
                )
            sizes[key] = size
            continue
        if key in sizes:
            continue
        if key in visiting:
            raise ManifestError(
                "parse", f"YAML alias refers to itself (line {node.start_mark.line + 1})"
            )
        visiting.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def decode_document(data: bytes, *, max_bytes: int = MAX_MANIFEST_BYTES) -> Any:
    """The single YAML or JSON document in `data`; None for an empty or blank input."""
    if len(data) > max_bytes:
        raise ManifestError("too_large", f"{len(data)} bytes, more than {max_bytes}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ManifestError("parse", f"not UTF-8 text: {err}") from err
    stripped = text.lstrip()
    if not stripped:
        return None
    try:
        if stripped[0] in "{[":
            doc = json.loads(text, parse_int=_json_int)
        else:
            doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader
    except json.JSONDecodeError as err:
        raise ManifestError("parse", f"invalid JSON: {err}") from err
    except yaml.YAMLError as err:
        raise ManifestError("parse", f"invalid YAML: {_cut(_one_line(str(err)))}") from err
    problem = _json_problem(doc, "<root>")
    if problem:
        raise ManifestError("parse", problem)
    return doc


def pod_from_file(data: bytes, *, path: str, node_name: str) -> JSON:
    """The one normalised Pod of a static-pod file."""
    with _contained():
        doc = decode_document(data)
        if doc is None:
            raise ManifestError("parse", "empty manifest")
        return _checked_pod(doc, node_name=node_name, source="file", origin=path, where="")


def pods_from_url_body(data: bytes, *, url: str, node_name: str) -> list[JSON]:
    """The normalised pods of a URL body: a Pod, a PodList, or nothing (empty body).

    One bad item refuses the whole body, as upstream: the URL is one snapshot, and
    applying half of it would remove the pods whose entries failed.
    """
    with _contained():
        return _pods_from_body(data, url=url, node_name=node_name)


def _pods_from_body(data: bytes, *, url: str, node_name: str) -> list[JSON]:
    doc = decode_document(data, max_bytes=MAX_URL_BODY_BYTES)
    if doc is None:
        return []
    if isinstance(doc, Mapping) and doc.get("kind") == "PodList":
        if doc.get("apiVersion") != "v1":
            raise ManifestError(
                "invalid",
                f"apiVersion: {_cut(repr(doc.get('apiVersion')))} is not supported, want 'v1'",
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
def _contained() -> Iterator[None]:
    """Make every failure of one manifest a `ManifestError`, never a crash of the source.

    A hostile nesting depth (`[[[[...]]]]`) hits Python's recursion limit in whichever
    of the parser, the checks or the deep copy gets there first. Anything else that
    escapes the specific handlers (a parser corner case, a MemoryError) is reported
    with its type, so the file is named in the log and the other manifests carry on.
    """
    try:
        yield
    except ManifestError:
        raise
    except RecursionError as err:
        raise ManifestError("parse", "document nested too deeply") from err
    except Exception as err:  # noqa: BLE001 - one bad manifest must not end the source
        text = _cut(_one_line(str(err)))
        raise ManifestError("parse", f"cannot decode: {type(err).__name__}: {text}") from err


def _json_problem(value: Any, path: str) -> str | None:
    """Why `value` cannot round-trip through JSON (and the API's int64), or None."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}: key {_cut(repr(key))} is not a string"
            if not _encodable(key):
                return f"{path}: key {_cut(repr(key))} is not valid Unicode text"
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
    if isinstance(value, _LongInt):
        return f"{path}: integer of {len(value.text)} characters is out of range (int64)"
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            return f"{path}: integer {value} is out of range (int64)"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path}: {value} is not a JSON number"
    if isinstance(value, str):
        return None if _encodable(value) else f"{path}: string is not valid Unicode text"
    if value is None or isinstance(value, float | bool):
        return None
    return f"{path}: a {type(value).__name__} value cannot be represented in JSON"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."

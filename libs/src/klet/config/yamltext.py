"""The YAML half of reading a KubeletConfiguration file (klet.config.decoding).

Kept apart so that PyYAML is imported only when a YAML file is actually read: most
services start without --config, and the library costs each process about 1 MB
resident. Every PyYAML error comes back as a ValueError with PyYAML's message, so the
decoder needs no import of yaml to catch it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from klet.config.shape import MAX_DEPTH, show

__all__ = ["parse_yaml"]


def parse_yaml(text: str) -> tuple[object, list[str]]:
    """The document in `text` and its duplicate-key problems.

    Raises ValueError for a syntax error or a document nested too deeply.
    """
    try:
        too_deep = _yaml_too_deep(text)
        if too_deep:
            raise ValueError(too_deep)
        loader = _StrictYamlLoader(text)
        loader.duplicates = []
        try:
            return loader.get_single_data(), loader.duplicates
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from exc


class _StrictYamlLoader(yaml.SafeLoader):
    """A safe loader that records duplicate keys instead of keeping the last one."""

    duplicates: list[str]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable key; construct_mapping reports it
            if duplicate:
                line = key_node.start_mark.line + 1
                self.duplicates.append(f"line {line}: duplicate field {show(key)}")
        return super().construct_mapping(node, deep=deep)


_OPENERS = (
    yaml.FlowSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.BlockMappingStartToken,
)
_CLOSERS = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken, yaml.BlockEndToken)


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\']|\'\')*\'')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _flow_depth(text: str) -> int:
    """The deepest `[`/`{` nesting outside quoted strings (a bracket inside a plain
    scalar, as in tcp://[::1]:10250, counts once: close enough for a bound of 64)."""
    depth = deepest = 0
    for ch in _NOT_BRACKET.sub("", _QUOTED.sub("", text)):
        depth = depth + 1 if ch in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def _yaml_too_deep(text: str) -> str | None:
    """PyYAML's composer recurses once per nesting level: a few thousand `[` take it
    seconds to fail with a RecursionError, and its scanner slows down quadratically with
    open flow collections. Flow nesting is counted on the raw text, block nesting on the
    (iterative) scanner's tokens, before anything is composed."""
    if _flow_depth(text) > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, _OPENERS):
            depth += 1
            if depth > MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep"
        elif isinstance(token, _CLOSERS):
            depth -= 1
    return None

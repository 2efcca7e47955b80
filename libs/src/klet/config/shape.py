"""What a parsed configuration document may look like before any field is read: its
bounds (depth, number of values once YAML aliases are expanded) and how a raw value is
shown in messages.

Both readers of a KubeletConfiguration file use these, the decoder (klet.config.decoding)
and its YAML half (klet.config.yamltext, which the decoder imports lazily), so they live
one floor below both: the YAML reader checks the flow depth of the text against the same
MAX_DEPTH the decoder checks the parsed document against.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["MAX_DEPTH", "MAX_VALUES", "shape_problem", "show"]


def show(raw: object) -> str:
    """A value as it appeared in the file, for messages."""
    if isinstance(raw, str):
        return json.dumps(raw, ensure_ascii=False)
    if isinstance(raw, Mapping):
        return "an object"
    if isinstance(raw, list | tuple):
        return "a list"
    if isinstance(raw, bool):
        return "true" if raw else "false"
    return repr(raw)


# Bounds on the parsed document. A KubeletConfiguration is a few levels deep with a few
# hundred values; a file past these is hostile or broken (a YAML alias bomb expands
# exponentially while its text stays small), and walking it could exhaust the stack or
# the CPU before any field check ran.
MAX_DEPTH = 64
MAX_VALUES = 100_000


def shape_problem(data: object) -> str | None:
    """Why `data` is too deep or too large once its aliases are expanded, else None.

    Iterative, and each distinct container is visited once (aliases share objects), so
    the check itself costs the size of the text, not of the expansion.
    """
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    open_nodes: set[int] = set()  # the path from the root: meeting one again is a cycle
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        if isinstance(node, Mapping):
            children: list[object] = [*node.keys(), *node.values()]
        elif isinstance(node, list | tuple):
            children = list(node)
        else:
            continue
        key = id(node)
        if done:
            open_nodes.discard(key)
            inner = [c for c in children if isinstance(c, Mapping | list | tuple)]
            sizes[key] = 1 + len(children) - len(inner) + sum(sizes[id(c)] for c in inner)
            depths[key] = 1 + max((depths[id(c)] for c in inner), default=0)
            if depths[key] > MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep"
            if sizes[key] > MAX_VALUES:
                return f"holds more than {MAX_VALUES} values once YAML aliases are expanded"
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            return "refers to itself (a recursive YAML alias)"
        if len(stack) > 4 * MAX_VALUES:
            return f"holds more than {MAX_VALUES} values"
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return None

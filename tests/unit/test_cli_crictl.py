"""`klet crictl`'s table (klet.cli.crictl): columns aligned three spaces apart, and names,
labels and tags (written by whoever created the sandbox, container or image through
CRI) shown with control characters escaped, never raw on the terminal."""

from __future__ import annotations

import unicodedata

from klet.cli.crictl import table

HOSTILE = "\x1b]0;owned\x07\x1b[2J"
"""The reproduced attack: retitle the terminal, then clear it."""


def test_cells_are_escaped_and_the_columns_line_up() -> None:
    text = table([["NAME", "POD"], [f"c{HOSTILE}", "web"], ["d", f"p\u202e{HOSTILE}"]])
    assert [ch for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")] == []
    head, first, second = text.splitlines()
    assert first.startswith("c\\x1b]0;owned\\x07\\x1b[2J   web")
    assert second.endswith("p\\u202e\\x1b]0;owned\\x07\\x1b[2J")
    assert head.index("POD") == first.index("web") == second.index("p\\u202e")

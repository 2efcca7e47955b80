"""The error type of configuration loading: every problem at once, each naming its field.

Kept apart from the loader so validation, flag parsing and settings can all produce
`Problem`s without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["ConfigError", "Problem"]


class Problem(NamedTuple):
    """One configuration problem: where (an upstream dotted field path, a flag such as
    `--port`, or an environment variable) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """Invalid configuration; `problems` lists every problem found, each naming its field,
    flag or file."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__(self.problems)

    def __str__(self) -> str:
        count = len(self.problems)
        head = f"invalid configuration ({count} problem{'s' if count != 1 else ''}):"
        return "\n  ".join([head, *self.problems])

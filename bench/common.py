"""What every benchmark script here shares, so each says only what it measures.

- `parser`: the command line, described by the first paragraph of the script's doc,
  with `--keep` and `--output` (`add_keep_and_output`);
- `begin`: warnings-only logging, the root check, and SIGTERM raising KeyboardInterrupt
  so the script's `finally` clean-up runs on `kill` as on Ctrl-C;
- `cleaning_up`: the clean-up block, which neither Ctrl-C nor SIGTERM interrupts;
- `run_steps`: clean-up steps, each attempted even when an earlier one failed;
- `load`, `write_results`, `entry` (the `__main__` call: exit 130 on an interrupt).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

Step = tuple[str, Callable[[], object]]


def parser(doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)


def add_keep_and_output(
    p: argparse.ArgumentParser,
    results: Path,
    *,
    keep_help: str = "keep the devstack dir (logs, configs)",
) -> None:
    p.add_argument("--keep", action="store_true", help=keep_help)
    p.add_argument("--output", type=Path, default=results, help=f"JSON results (default {results})")


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def begin(*, root_for: str | None) -> int | None:
    """Set the script up; 2 (its exit code) when `root_for` names what needs root and
    this is not root, else None."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if root_for is not None and os.geteuid() != 0:
        print(f"bench: must run as root ({root_for})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    return None


@contextlib.contextmanager
def cleaning_up() -> Iterator[None]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("bench: cleaning up ...", flush=True)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_steps(steps: Sequence[Step], *, run_dir: Path, keep: bool) -> None:
    """Run every step, reporting the failed ones; then remove `run_dir` unless `keep`."""
    if not keep:
        steps = [*steps, ("remove run dir", lambda: shutil.rmtree(run_dir, ignore_errors=True))]
    for what, step in steps:
        try:
            step()
        except Exception as err:  # noqa: BLE001 - report and go on with the rest
            print(f"bench: clean-up step '{what}' failed: {err!r}", file=sys.stderr)
    if keep:
        print(f"bench: kept {run_dir}")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_results(path: Path, res: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")


def entry(main: Callable[[], int]) -> NoReturn:
    try:
        sys.exit(main())
    except KeyboardInterrupt as err:
        print(
            f"bench: interrupted ({str(err) or 'Ctrl-C'}); clean-up ran (failed steps, if any, "
            "are reported above)",
            file=sys.stderr,
        )
        sys.exit(130)

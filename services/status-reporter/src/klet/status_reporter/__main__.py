"""Entry point: `python -m klet.status_reporter [kubelet flags]`, and `klet run status-reporter`.

Only the shared entry sequence (klet.cli.service) with this service's start-up:
building the dependencies, inside the event loop, and running the root tasks.
"""

from __future__ import annotations

import sys

from klet.cli.service import run_service
from klet.config import Settings


async def start(settings: Settings) -> int | None:
    from klet.status_reporter.app import main
    from klet.status_reporter.wiring import build_deps

    return await main(build_deps(settings))


def main(argv: list[str] | None = None) -> int:
    return run_service("status-reporter", argv, start)


if __name__ == "__main__":
    sys.exit(main())

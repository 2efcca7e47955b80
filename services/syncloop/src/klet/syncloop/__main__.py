"""Entry point: `python -m klet.syncloop [kubelet flags]`, and `klet run syncloop`.

Only the shared entry sequence (klet.cli.service) with this service's start-up:
building the dependencies, inside the event loop, and running the root tasks.
"""

from __future__ import annotations

import sys

from klet.cli.service import run_service
from klet.config import Settings


async def start(settings: Settings) -> int | None:
    from klet.syncloop.app import main
    from klet.syncloop.wiring import build_deps

    return await main(build_deps(settings))


def main(argv: list[str] | None = None) -> int:
    return run_service("syncloop", argv, start)


if __name__ == "__main__":
    sys.exit(main())

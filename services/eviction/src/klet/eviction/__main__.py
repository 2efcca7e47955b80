"""Entry point: `python -m klet.eviction [kubelet flags]`, and `klet run eviction`.

Only the shared entry sequence (klet.cli.service) with this service's start-up:
building the dependencies inside the event loop (an invalid eviction setting is refused
here, naming its field) and running the root tasks.
"""

from __future__ import annotations

import sys

from klet.cli.service import run_service
from klet.config import ConfigError, Settings


async def start(settings: Settings) -> int | None:
    from klet.eviction.app import main
    from klet.eviction.wiring import build_deps

    try:
        deps = build_deps(settings)
    except ConfigError as err:
        print(f"eviction: {err}", file=sys.stderr)
        return 1
    return await main(deps)


def main(argv: list[str] | None = None) -> int:
    return run_service("eviction", argv, start)


if __name__ == "__main__":
    sys.exit(main())

"""Entry point: `python -m klet.pod_source [kubelet flags]`, and `klet run pod-source`.

Only the shared entry sequence (klet.cli.service) with this service's start-up:
building the dependencies, inside the event loop, and running the root tasks.
"""

from __future__ import annotations

import sys

from klet.cli.service import run_service
from klet.config import Settings


async def start(settings: Settings) -> int | None:
    from klet.pod_source.app import main
    from klet.pod_source.wiring import build_deps

    return await main(build_deps(settings))


def main(argv: list[str] | None = None) -> int:
    return run_service("pod-source", argv, start)


if __name__ == "__main__":
    sys.exit(main())

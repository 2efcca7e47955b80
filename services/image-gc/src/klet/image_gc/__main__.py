"""Entry point: `python -m klet.image_gc [kubelet flags]`, and `klet run image-gc`.

Only the shared entry sequence (klet.cli.service) with this service's start-up: the
image GC policy is validated first (an invalid one exits 1 naming the field, before
anything connects), then the dependencies are built inside the event loop and the root
tasks run.
"""

from __future__ import annotations

import logging
import sys

from klet.cli.service import run_service
from klet.config import Settings

log = logging.getLogger("klet.image_gc")


async def start(settings: Settings) -> int | None:
    from klet.image_gc.app import main
    from klet.image_gc.imageselect import PolicyError
    from klet.image_gc.wiring import build_deps

    try:
        deps = build_deps(settings)
    except PolicyError as err:
        log.error("invalid image GC policy", extra={"error": str(err)})
        print(f"image-gc: invalid image GC policy: {err}", file=sys.stderr)
        return 1
    return await main(deps)


def main(argv: list[str] | None = None) -> int:
    return run_service("image-gc", argv, start)


if __name__ == "__main__":
    sys.exit(main())

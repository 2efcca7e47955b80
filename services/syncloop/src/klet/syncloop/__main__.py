"""Entry point: `python -m klet.syncloop` or `klet run syncloop`."""

from __future__ import annotations

import asyncio
import os
import sys

from klet.config import ConfigError, load_settings
from klet.obs import configure_logging


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings(
            sys.argv[1:] if argv is None else argv, env=os.environ, service="syncloop"
        )
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    configure_logging(
        service="syncloop", verbosity=settings.klet.verbosity, fmt=settings.klet.log_format
    )
    from klet.syncloop.app import main as app_main
    from klet.syncloop.wiring import build_deps

    async def run() -> int:
        # Built inside the loop: grpc.aio channels bind to the loop that exists when made.
        return await app_main(build_deps(settings))

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())

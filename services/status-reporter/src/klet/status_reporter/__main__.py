"""Entry point: `python -m klet.status_reporter [kubelet flags]`, and `klet run status-reporter`.

Only parses settings, configures logging, builds the dependencies and runs the event
loop; everything else lives in `wiring.py` and `app.py` (STYLE rule 1). Invalid
configuration is refused before anything starts, with every problem listed.
"""

from __future__ import annotations

import asyncio
import os
import sys

from klet.config import ConfigError, load_settings
from klet.obs import RootTaskFailed, configure_logging
from klet.status_reporter import app
from klet.status_reporter.wiring import SERVICE, build_deps


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings(
            sys.argv[1:] if argv is None else argv, env=os.environ, service=SERVICE
        )
    except ConfigError as err:
        print(f"{SERVICE}: {err}", file=sys.stderr)
        return 1
    configure_logging(
        service=SERVICE, verbosity=settings.klet.verbosity, fmt=settings.klet.log_format
    )
    try:
        asyncio.run(app.main(build_deps(settings)))
    except RootTaskFailed:
        return 1  # already logged, with the task's name and traceback
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Entry point: `python -m klet.pod_source [kubelet flags]`, and `klet run pod-source`.

Only parses settings, configures logging, builds the dependencies and runs the event
loop (STYLE rule 1). Invalid configuration is refused before anything starts, with
every problem listed.
"""

from __future__ import annotations

import asyncio
import os
import sys

from klet.config import ConfigError, load_settings
from klet.obs import configure_logging
from klet.pod_source import app
from klet.pod_source.wiring import SERVICE, build_deps


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
    return asyncio.run(app.main(build_deps(settings)))


if __name__ == "__main__":
    sys.exit(main())

"""`klet healthcheck <service>`: exit 0 when the service's /healthz on this host passes.

For container health checks (docker-compose.yml), where the image has no curl: it runs
in the service's own container, so it finds the port the way the service chose it —
KLET_SERVICE_PORT, else the service's default (10260-10264) — and connects to
KLET_SERVICE_BIND_ADDRESS, or loopback when that is a wildcard. On failure it prints
the status and the check list (/healthz names the failing checks) and exits 1.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from klet.model.layout import DEFAULT_SERVICE_PORTS


def healthz_url(service: str, env: Mapping[str, str]) -> str:
    port = int(env.get("KLET_SERVICE_PORT") or 0) or DEFAULT_SERVICE_PORTS[service]
    address = env.get("KLET_SERVICE_BIND_ADDRESS") or "127.0.0.1"
    if address in ("0.0.0.0", "::"):
        address = "127.0.0.1" if address == "0.0.0.0" else "::1"
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/healthz"


def healthcheck(argv: Sequence[str], *, timeout_s: float = 5.0) -> int:
    if len(argv) != 1 or argv[0] not in DEFAULT_SERVICE_PORTS:
        print(
            f"usage: klet healthcheck <service>; one of: {', '.join(DEFAULT_SERVICE_PORTS)}",
            file=sys.stderr,
        )
        return 2
    url = healthz_url(argv[0], os.environ)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as err:
        print(f"{url}: {err.code}\n{err.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"{url}: {err}", file=sys.stderr)
        return 1
    return 0

"""`klet healthcheck <service>`: exit 0 when the service's /healthz on this host passes.

For container health checks (docker-compose.yml, the Helm chart's exec probes), where
the image has no curl. It runs in the service's own container (as `docker exec` and an
exec probe do: the container's environment and filesystem), so it finds the port the
way that replica published it:

- KLET_SERVICE_PORT_FILE set: the port file the replica writes once its port listens
  (klet.portfiles; the replica removes it at start, so one left by an earlier run of
  the container never counts). No file yet fails with "not listening yet". Compose
  puts it in the container's own filesystem, so with `--scale` each replica's check
  reaches its own port, not a sibling's (pids do not tell them apart under `pid: host`).
- Otherwise KLET_SERVICE_PORT, else the service's default (10260-10264); a port of 0
  (any free port) cannot be checked without the port file.

It connects to the recorded address (or KLET_SERVICE_BIND_ADDRESS), loopback when that
is a wildcard. On failure it prints the reason (for /healthz, the status and the list
naming the failing checks) and exits 1; a usage error exits 2.

It imports no web framework: a Python start is most of a check's cost, every 10 s in
every container.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from klet.model.layout import DEFAULT_SERVICE_PORTS
from klet.portfiles import read_port_file

_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class NotChecked(Exception):
    """The service's port cannot be found; the message says why."""


def _url(address: str, port: int) -> str:
    address = _LOOPBACK.get(address, address)
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/healthz"


def healthz_url(service: str, env: Mapping[str, str]) -> str:
    """The /healthz URL of `service`'s replica this environment belongs to.

    Raises NotChecked when it cannot be known (no port file yet, or port 0 without one).
    """
    port_file = env.get("KLET_SERVICE_PORT_FILE")
    if port_file:
        try:
            record = read_port_file(Path(port_file))
        except FileNotFoundError:
            raise NotChecked(f"{service}: not listening yet (no {port_file})") from None
        except (OSError, ValueError) as err:
            raise NotChecked(f"{service}: cannot read {port_file}: {err}") from None
        if record.service != service:
            raise NotChecked(f"{port_file}: a port file of {record.service}, not of {service}")
        return _url(record.host, record.port)
    text = env.get("KLET_SERVICE_PORT") or ""
    try:
        port = int(text) if text else DEFAULT_SERVICE_PORTS[service]
    except ValueError:
        raise NotChecked(f"KLET_SERVICE_PORT: invalid integer {text!r}") from None
    if port == 0:
        raise NotChecked(
            f"{service}: KLET_SERVICE_PORT=0 (any free port) needs KLET_SERVICE_PORT_FILE "
            "to find the port"
        )
    return _url(env.get("KLET_SERVICE_BIND_ADDRESS") or "127.0.0.1", port)


def healthcheck(argv: Sequence[str], *, timeout_s: float = 5.0) -> int:
    if len(argv) != 1 or argv[0] not in DEFAULT_SERVICE_PORTS:
        print(
            f"usage: klet healthcheck <service>; one of: {', '.join(DEFAULT_SERVICE_PORTS)}",
            file=sys.stderr,
        )
        return 2
    try:
        url = healthz_url(argv[0], os.environ)
    except NotChecked as err:
        print(err, file=sys.stderr)
        return 1
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

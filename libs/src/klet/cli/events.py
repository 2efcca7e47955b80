"""`klet events [-f] [-n NS | -A] [-o wide|json]`: the node's Events, as `kubectl get
events` shows them.

Every service appends the Events it records to its own `events:<service>` stream; in
cluster mode status-reporter's leader posts them to the apiserver, standalone nobody
reads them. This reads all five streams with XREAD, never XREADGROUP or XACK, so it
takes nothing from status-reporter's consumer group and works in both modes. It folds
and prints them with klet.cli.eventview; `-f` then keeps reading (XREAD BLOCK from the
last entry read on each stream, so nothing recorded between the listing and the wait
is missed) and prints each new or grown Event as one more line (`-o json`: one Event
object per line), as `kubectl get events -w` does. Every namespace is shown unless
`-n` names one: a standalone node's static pods live in several (`-A` is accepted for
kubectl's habit).

A stream entry that does not decode is skipped with a warning on stderr naming the key
and entry ID; the rest are shown, except the records kept for pods' histories only
(`klet.model.podhistory.HISTORY_ONLY`: `klet why` shows them), which are no Events.

Which bus, as whom:

- `--redis-url` / `KLET_REDIS_URL`, `--redis-username` / `KLET_REDIS_USERNAME`,
  `--redis-password-file` / `KLET_REDIS_PASSWORD_FILE` (TLS: `--redis-ca-file`, ...),
  the services' flags and variables, so inside status-reporter's container (compose,
  the chart) `klet events` runs as status-reporter's user, which may tail the streams
  (klet.bus.acl). A username without a URL means the default socket.
- Neither given: the Redis `klet up` started, found through `<run-dir>/endpoints.json`
  (`--run-dir`, `KLET_RUN_DIR`, default `.run` as `make run`), as its admin.

The node is `--node` (or `--hostname-override`), else the one a service user is of
(`klet-status-reporter@<node>`), else the hostname, as the services choose it, unless
the bus (listed by SCAN, as the admin of `klet up`'s Redis may) holds no data of the
hostname: then its only node, which is how a node started with `--hostname-override`
is found without repeating the name; several nodes and none the hostname is refused
naming them. `klet why` answering "no history" names the nodes on the bus when its
node is not among them.

What is printed came from the bus, written by services about pods: the table's cells
(klet.cli.eventview), a skipped entry's error and the node names read by SCAN show
control characters escaped, so nothing on the bus reaches the terminal as an escape
sequence. (`klet gc` and `klet evict` need no node: they ask the
services' sockets in the run directory.)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlsplit

from klet.bus.acl import ADMIN_USER, SERVICES, check_node, read_password
from klet.cli.eventview import (
    Correlator,
    EventRow,
    cells,
    event_list,
    header,
    in_namespace,
    render_line,
    to_event,
    widths,
)
from klet.config.settings import DEFAULT_REDIS_URL, loopback
from klet.model.podhistory import history_only, printable
from klet.model.records import EventRecord

if TYPE_CHECKING:
    # Imported where used: redis-py is most of this command's start-up, and a usage
    # error needs none of it.
    from klet.bus.redisbus import Bus

BLOCK_MS = 1000
"""One blocking XREAD waits this long (under the client's 5 s socket timeout)."""

BATCH = 1000
"""Entries read per stream and call."""


class UsageError(Exception):
    """The bus or the node cannot be found from the flags; the message says why."""


@dataclass(frozen=True)
class BusAccess:
    """Where the bus is and who reads it (a `klet.bus.BusAuth`)."""

    url: str
    node: str
    username: str = ""
    node_given: bool = True
    """False when `node` is only the machine's hostname (no --node, no service user)."""
    nodes_present: tuple[str, ...] = ()
    """The nodes with data on the bus, when they were looked up (`settle_node`)."""
    password: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="klet events",
        description="The node's Events (every events:<service> stream), as kubectl get "
        "events shows them.",
    )
    p.add_argument("-f", "--follow", "-w", "--watch", action="store_true", dest="follow")
    ns = p.add_mutually_exclusive_group()
    ns.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    ns.add_argument("-A", "--all-namespaces", action="store_true", help="all (the default)")
    p.add_argument("-o", "--output", choices=["wide", "json"], default="")
    add_bus_arguments(p)
    return p


def add_bus_arguments(p: argparse.ArgumentParser) -> None:
    """The flags `bus_access` reads: which node, which bus, as whom."""
    p.add_argument("--node", "--hostname-override", dest="node", default="")
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument("--redis-url", default="")
    p.add_argument("--redis-username", default="")
    p.add_argument("--redis-password-file", type=Path, default=None)
    p.add_argument("--redis-ca-file", type=Path, default=None)
    p.add_argument("--redis-cert-file", type=Path, default=None)
    p.add_argument("--redis-key-file", type=Path, default=None)
    p.add_argument("--allow-insecure-redis", action="store_true")


def node_of_user(username: str) -> str:
    """The node of a service user `klet-<service>@<node>`, else ""."""
    prefix, at, node = username.partition("@")
    if at and prefix in {f"klet-{s}" for s in SERVICES}:
        return node
    return ""


def pick_node(hostname: str, present: Sequence[str]) -> str:
    """The node to read when no --node is given: the hostname when the bus has it (or
    has no node at all), else the bus's only node (a node started with
    --hostname-override); several others and not the hostname is a UsageError naming
    them."""
    if hostname in present or not present:
        return hostname
    if len(present) == 1:
        return present[0]
    raise UsageError(
        f"no --node, and this bus holds several nodes, none named {hostname} (the "
        f"hostname): {printable(', '.join(present))}; give --node"
    )


async def settle_node(access: BusAccess) -> BusAccess:
    """`access` with its node settled: as given, else `pick_node` over the nodes on the
    bus. Raises BusError (the bus unreachable, or the user may not list keys) and
    UsageError."""
    if access.node_given:
        return access
    from klet.bus.redisbus import Bus

    bus = Bus.from_url(access.url, access.node, auth=access, timeout_s=5.0)
    try:
        present = await bus.nodes()
    finally:
        await bus.close()
    node = pick_node(access.node, present)
    return dataclasses.replace(access, node=node, nodes_present=tuple(present))


async def nodes_hint(access: BusAccess) -> str:
    """What to add to "nothing found on node X": the nodes the bus holds when X is not
    among them, so a mistyped or overridden name shows; "" when X is there or the nodes
    cannot be listed (the user may not, or the bus is gone: the answer stands without)."""
    present = list(access.nodes_present)
    if not present:
        from klet.bus.redisbus import Bus, BusError

        bus = Bus.from_url(access.url, access.node, auth=access, timeout_s=5.0)
        try:
            present = await bus.nodes()
        except BusError:
            return ""
        finally:
            await bus.close()
    if access.node in present:
        return ""
    return f"; nodes on this bus: {printable(', '.join(present)) or 'none'}"


def bus_access(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    hostname: Callable[[], str] = socket.gethostname,
) -> BusAccess:
    """The bus and credentials from the flags, the KLET_* variables or `klet up`'s run
    directory; UsageError naming what is missing."""

    def path(value: Path | None, var: str) -> Path | None:
        return value if value is not None else (Path(env[var]) if env.get(var) else None)

    url = args.redis_url or env.get("KLET_REDIS_URL", "")
    username = args.redis_username or env.get("KLET_REDIS_USERNAME", "")
    password_file = path(args.redis_password_file, "KLET_REDIS_PASSWORD_FILE")
    if url or username:
        url = url or DEFAULT_REDIS_URL
    else:
        run_dir = path(args.run_dir, "KLET_RUN_DIR") or Path(".run")
        info = run_dir / "endpoints.json"
        try:
            found = json.loads(info.read_text())
            url = str(found["redis_url"])
            admin_file = found["redis_admin_password_file"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(
                f"no --redis-url or --redis-username, and no klet up in {run_dir}: "
                f"cannot read {info}: {err}"
            ) from None
        if not admin_file:
            raise UsageError(
                f"{info}: klet up runs on a Redis of its own choosing ({url}); give "
                "--redis-url, --redis-username and --redis-password-file"
            )
        username, password_file = ADMIN_USER, Path(admin_file)
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise UsageError(f"--redis-url: must be a redis://, rediss:// or unix:// URL, got {url!r}")
    if parts.password and args.redis_url:
        raise UsageError(
            "--redis-url: must not contain a password (every user can read it in "
            "/proc/<pid>/cmdline); give --redis-password-file"
        )
    password = None
    if password_file is not None:
        try:
            password = read_password(password_file)
        except OSError as err:
            raise UsageError(f"--redis-password-file: {err}") from None
    has_password = password is not None or parts.password is not None
    if (
        parts.scheme == "redis"
        and has_password
        and not loopback(parts)
        and not args.allow_insecure_redis
    ):
        raise UsageError(
            f"--redis-url: {parts.hostname} is not loopback and redis:// sends the password "
            "in clear: use rediss://, or pass --allow-insecure-redis"
        )
    given = args.node or node_of_user(username)
    raw_node = given or hostname()
    try:
        node = check_node(raw_node.strip().lower())
    except ValueError as err:
        raise UsageError(f"--node: {err}") from None
    return BusAccess(
        url=url,
        node=node,
        username=username,
        node_given=bool(given),
        password=password,
        ca_file=path(args.redis_ca_file, "KLET_REDIS_CA_FILE"),
        cert_file=path(args.redis_cert_file, "KLET_REDIS_CERT_FILE"),
        key_file=path(args.redis_key_file, "KLET_REDIS_KEY_FILE"),
    )


@dataclass
class Printer:
    """Writes the listing, then each new or grown Event of `-f` as one more line."""

    node: str
    namespace: str | None
    output: str  # "", "wide" or "json"
    out: TextIO
    clock: Callable[[], float] = time.time
    _widths: list[int] = field(default_factory=list)

    @property
    def namespaced(self) -> bool:
        return self.namespace is not None

    def listing(self, rows: Sequence[EventRow], *, follow: bool) -> None:
        shown = [r for r in rows if in_namespace(r, self.namespace)]
        if self.output == "json":
            if follow:
                for row in shown:
                    self.event(row)
            else:
                self.out.write(json.dumps(event_list(shown, node=self.node), indent=4) + "\n")
            self.out.flush()
            return
        wide = self.output == "wide"
        now = self.clock()
        lines = [header(namespaced=self.namespaced, wide=wide)]
        lines += [
            cells(r, now=now, namespaced=self.namespaced, wide=wide, node=self.node) for r in shown
        ]
        self._widths = widths(lines)
        if len(lines) > 1 or follow:
            self.out.write("\n".join(render_line(line, self._widths) for line in lines) + "\n")
        elif self.namespace is None:
            self.out.write("No events found.\n")
        else:
            self.out.write(f"No events found in {self.namespace} namespace.\n")
        self.out.flush()

    def event(self, row: EventRow) -> None:
        if not in_namespace(row, self.namespace):
            return
        if self.output == "json":
            self.out.write(json.dumps(to_event(row, node=self.node), separators=(",", ":")) + "\n")
        else:
            line = cells(
                row,
                now=self.clock(),
                namespaced=self.namespaced,
                wide=self.output == "wide",
                node=self.node,
            )
            self.out.write(render_line(line, self._widths) + "\n")
        self.out.flush()


class EventReader:
    """The node's Event streams, read from the start and then followed, without a
    consumer group (the streams' `MergedStream.tail`)."""

    def __init__(self, bus: Bus, warn: TextIO) -> None:
        self.bus = bus
        self.feed = bus.merged_stream([bus.stream(f"events:{s}", EventRecord) for s in SERVICES])
        self.cursors = {f"events:{s}": "0-0" for s in SERVICES}
        self.warn = warn

    async def read(self, *, block_ms: int | None) -> list[EventRecord]:
        """The records after the cursors (blocking up to `block_ms` for a first one),
        oldest first per stream; bad entries are skipped with a warning."""
        out = []
        for entry in await self.feed.tail(self.cursors, count=BATCH, block_ms=block_ms):
            name, _, entry_id = entry.id.partition(" ")
            self.cursors[name] = entry_id
            if entry.record is None:
                # The error quotes what the entry holds: escaped, as the table is.
                self.warn.write(
                    f"klet events: skipping entry {entry_id} of {self.bus.key(name)}: "
                    f"{printable(str(entry.error))}\n"
                )
                self.warn.flush()
                continue
            if not history_only(entry.record):
                out.append(entry.record)
        return out

    async def backlog(self) -> list[EventRecord]:
        """Everything the streams hold now."""
        found: list[EventRecord] = []
        while batch := await self.read(block_ms=None):
            found += batch
        return found


async def run(access: BusAccess, printer: Printer, *, follow: bool, warn: TextIO) -> None:
    from klet.bus.redisbus import Bus

    bus = Bus.from_url(access.url, access.node, auth=access, timeout_s=5.0)
    try:
        reader = EventReader(bus, warn)
        correlator = Correlator()
        for record in sorted(await reader.backlog(), key=lambda r: r.at):
            correlator.add(record)
        printer.listing(correlator.rows(), follow=follow)
        while follow:
            for record in sorted(await reader.read(block_ms=BLOCK_MS), key=lambda r: r.at):
                printer.event(correlator.add(record))
    finally:
        await bus.close()


def events(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(list(argv))
    try:
        access = bus_access(args, os.environ if env is None else env)
    except UsageError as err:
        print(f"klet events: {err}", file=sys.stderr)
        return 2
    from klet.bus.redisbus import BusError

    try:
        access = asyncio.run(settle_node(access))
    except UsageError as err:
        print(f"klet events: {err}", file=sys.stderr)
        return 2
    except BusError as err:
        print(
            f"klet events: {access.url} as {access.username or 'default'}: {err}", file=sys.stderr
        )
        return 1
    printer = Printer(
        node=access.node, namespace=args.namespace, output=args.output, out=sys.stdout
    )
    try:
        asyncio.run(run(access, printer, follow=args.follow, warn=sys.stderr))
    except BusError as err:
        print(
            f"klet events: {access.url} as {access.username or 'default'}: {err}", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `klet events -f | head`: the reader is gone. Nothing more to write, and the
        # interpreter's last flush of stdout must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

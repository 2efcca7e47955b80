"""Who may do what on the bus: the Redis ACL user of each service of each node.

syncloop runs whatever the `desired` table holds, so write access to a node's keys is
root on that node. Every service therefore connects as its own Redis user, limited to
the keys of its own node (`klet:<node>:...`) and, per key, to the commands it needs:
only pod-source may write `desired` and the `pods` stream, only syncloop `status`, only
image-gc `images`; each may touch only its own lease, its own Events stream and its own
node conditions. A stolen credential of one
service or one node is worth that service on that node, no more.

The grants are Redis 7 ACL selectors, one per (keys, commands) pair, so a command is
allowed only with keys of the same grant (XADD to `events` does not let status-reporter
XADD to `podstatus`, which it only consumes). No service may run Lua of its own (no
EVAL, no FUNCTION): the fenced writes and the lease operations are the functions of
klet's library (klet.bus.functions), which the admin loads and each service may call by
name (`+fcall|<name>`) with any key it can touch at all; Redis checks every `redis.call`
inside a function against the same selectors, so a function can do nothing the user
could not do directly.

This module is pure data and text: `klet up` and the dev stack write its lines into the
ACL file of the Redis they start, and an operator of a shared Redis gets the same lines
from `acl_file_lines` (the README lists the grants from `describe`). It imports nothing
of `redis`. The grants name the function library's current version, so an upgrade
rewrites the ACL lines along with the library.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from klet.bus.functions import CONDITION_TYPES, FUNCTIONS, generation_name

SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")

ADMIN_USER = "klet-admin"
"""The set-up and test credential of a dev-stack Redis: every key and command. No
service is ever given it (`klet up` passes each service its own user only)."""

# Commands every authenticated service needs, on no key: liveness checks (redis-py's
# health check is a PING), MULTI/EXEC around unfenced writes (each queued command is
# still checked against the grants), TIME (the fenced write starts a new table
# generation counter from the server's clock, klet.bus.functions). Not SELECT: klet's
# keys live in database 0 and a service may write nowhere else (the settings refuse a
# URL naming another database).
CONNECTION_COMMANDS = ("ping", "multi", "exec", "discard", "time")

TABLE_READ = ("hget", "hmget", "hgetall")
TABLE_WRITE = (*TABLE_READ, "hset", "hdel")
STREAM_PUBLISH = ("xadd",)
# A consumer group's bookkeeping is a write to the stream (XREADGROUP moves the group's
# cursor), so consuming is a grant of its own, without XADD.
STREAM_CONSUME = (
    "xgroup|create",
    "xgroup|delconsumer",
    "xreadgroup",
    "xack",
    "xautoclaim",
    "xinfo|consumers",
    "xlen",
)
# Reading a stream without a group (each reader its own cursor) changes nothing in it.
STREAM_TAIL = ("xread", "xrevrange", "xlen")
# A stream per pod (its history), each bounded in length and given an expiry by the
# same fenced write that appends to it: the only keys a glob grants, and every one of
# them goes away by itself.
JOURNAL = ("xadd", "pexpire")
# redis-py sends INCR as INCRBY.
LEASE = ("get", "set", "pexpire", "pttl", "del", "incr", "incrby", "exists")
# Each table's generation counter (`gen:<table>`, klet.bus.functions): its readers read
# it, the counters of several tables in one MGET (so one grant holds all of a service's
# counters); its writer's fenced write moves it (INCR, or SET when new), and an unfenced
# write (tests, tools) the same way (SET NX, INCRBY).
GENERATION_READ = ("get", "mget")
GENERATION_WRITE = ("incr", "incrby", "set")
# The library's functions, each by name (FCALL's first argument); TYPE: the fenced
# write checks each key's type before its first write.
FUNCTION_CALLS = (*(f"fcall|{name}" for name in FUNCTIONS), "type")

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class Grant:
    """Commands allowed on some of a node's keys (names after the `klet:<node>:` prefix;
    a trailing `*` is a Redis glob)."""

    keys: tuple[str, ...]
    commands: tuple[str, ...]


@dataclass(frozen=True)
class ServiceAccess:
    """What one service does on its node's bus."""

    reads: tuple[str, ...] = ()  # tables it reads
    writes: tuple[str, ...] = ()  # tables it reads and writes
    publishes: tuple[str, ...] = ()  # streams it appends to
    consumes: tuple[str, ...] = ()  # streams it reads through a consumer group
    tails: tuple[str, ...] = ()  # streams it reads without a group (XREAD)
    leases: tuple[str, ...] = field(default=())  # its own leases (key and fence counter)
    journals: tuple[str, ...] = ()  # streams it appends to and gives an expiry (globs)

    def grants(self) -> tuple[Grant, ...]:
        # The lease and its fence counter, nothing else: a glob would let a service
        # create keys without end.
        lease_keys = tuple(
            k for name in self.leases for k in (f"lease:{name}", f"lease:{name}:fence")
        )
        tables = (*self.reads, *self.writes)
        grants = [
            Grant(self.reads, TABLE_READ),
            Grant(self.writes, TABLE_WRITE),
            Grant(tuple(generation_name(t) for t in tables), GENERATION_READ),
            Grant(tuple(generation_name(t) for t in self.writes), GENERATION_WRITE),
            Grant(self.publishes, STREAM_PUBLISH),
            Grant(self.consumes, STREAM_CONSUME),
            Grant(self.tails, STREAM_TAIL),
            Grant(lease_keys, LEASE),
            Grant(self.journals, JOURNAL),
        ]
        every_key = tuple(dict.fromkeys(k for g in grants for k in g.keys))
        grants.append(Grant(every_key, FUNCTION_CALLS))
        return tuple(g for g in grants if g.keys)


# CONDITION_TYPES (klet.bus.functions, which the library's text is built from): the
# node condition types each service may contribute in its own `node:<service>`. Redis
# cannot tell one hash field from another in a grant, so the fenced write refuses any
# other row before writing, and the readers (klet.bus.schema.NodeConditions) leave one
# out, for a row written with the direct HSET the grant also allows.

CONDITION_WRITERS = tuple(CONDITION_TYPES)
"""The services that contribute node conditions, each to its own `node:<service>`."""


def owns_condition(service: str, key: str, type_: str) -> bool:
    """Whether a row keyed `key` holding a condition of `type_` in `node:<service>` is
    one `service` may contribute."""
    return key == type_ and type_ in CONDITION_TYPES.get(service, frozenset())


_EVENTS = tuple(f"events:{s}" for s in SERVICES)
_CONDITIONS = tuple(f"node:{s}" for s in CONDITION_WRITERS)

# Derived from what each service does on the bus (klet.bus.schema.NodeBus and the
# services' publishers, consumers and leases); a service that starts touching another
# key needs its line here, or Redis answers NOPERM. One writer per key: each service
# appends to its own `events:<service>` and writes its own `node:<service>`; a key two
# services wrote let either forge the other's records or break the key for both.
ACCESS: Mapping[str, ServiceAccess] = {
    "pod-source": ServiceAccess(
        writes=("desired", "sources"),
        publishes=("pods", "events:pod-source"),
        leases=("pod-source",),
    ),
    "syncloop": ServiceAccess(
        reads=("desired", "sources", "node:eviction"),
        writes=("status", "node:syncloop", "csidrivers", "volumes", "devices"),
        publishes=("podstatus", "events:syncloop"),
        consumes=("pods",),
        leases=("syncloop",),
    ),
    "status-reporter": ServiceAccess(
        reads=(
            "desired",
            "status",
            "sources",
            "csidrivers",
            "volumes",
            "devices",
            *_CONDITIONS,
        ),
        writes=("history",),
        publishes=("events:status-reporter",),
        consumes=_EVENTS,
        # Tailing the Events streams too: `klet events` in its container reads them
        # without the group (XREAD), so it takes no entry from the leader's consumer;
        # `klet why` reads the pods' histories the same way.
        tails=("podstatus", *_EVENTS, "history:*"),
        leases=("status-reporter",),
        journals=("history:*",),
    ),
    "eviction": ServiceAccess(
        reads=("desired", "status"),
        writes=("node:eviction",),
        publishes=("events:eviction",),
        leases=("eviction",),
    ),
    "image-gc": ServiceAccess(
        reads=("desired", "status", "sources"),
        writes=("images",),
        publishes=("events:image-gc",),
        leases=("image-gc",),
    ),
}


def check_node(node: str) -> str:
    """`node`, if it can be put in a key pattern as it is (a DNS-1123 subdomain has no
    glob or space characters); ValueError otherwise."""
    if not (len(node) <= 253 and _NODE_NAME.fullmatch(node)):
        raise ValueError(f"{node!r} is not a valid node name (DNS-1123 subdomain)")
    return node


def user_name(node: str, service: str) -> str:
    """The Redis user of `service` on `node`, e.g. `klet-syncloop@node-a`."""
    if service not in ACCESS:
        raise ValueError(f"unknown service {service!r} (one of {', '.join(ACCESS)})")
    return f"klet-{service}@{check_node(node)}"


def password_hash(password: str) -> str:
    """The form an ACL file keeps a password in (`#<sha256 hex>`), so the file itself
    holds no usable secret."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def service_rules(node: str, service: str) -> list[str]:
    """ACL SETUSER rules (without the password) of `service` on `node`."""
    prefix = f"klet:{check_node(node)}:"
    rules = ["resetkeys", "resetchannels", "-@all", *(f"+{c}" for c in CONNECTION_COMMANDS)]
    for grant in ACCESS[service].grants():
        keys = " ".join(f"~{prefix}{k}" for k in grant.keys)
        commands = " ".join(f"+{c}" for c in grant.commands)
        rules.append(f"({keys} {commands})")
    return rules


def service_line(node: str, service: str, password: str) -> str:
    """The ACL file line of `service` on `node`."""
    rules = " ".join(service_rules(node, service))
    return f"user {user_name(node, service)} on {password_hash(password)} {rules}"


def admin_line(password: str) -> str:
    return f"user {ADMIN_USER} on {password_hash(password)} ~* &* +@all"


def acl_file_lines(
    admin_password: str, node_passwords: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """A whole ACL file: the default (unauthenticated) user off, the admin, and every
    service user of every node in `node_passwords` (node -> service -> password)."""
    lines = ["user default off", admin_line(admin_password)]
    for node in sorted(node_passwords):
        for service in SERVICES:
            if service in node_passwords[node]:
                lines.append(service_line(node, service, node_passwords[node][service]))
    return lines


def describe(services: Iterable[str] = SERVICES) -> str:
    """The grants as text, one line per service (for docs and `--help` output)."""
    out = []
    for service in services:
        a = ACCESS[service]
        parts = [
            ("reads", a.reads),
            ("reads and writes", a.writes),
            ("appends to", a.publishes),
            ("consumes", a.consumes),
            ("tails", a.tails),
            ("holds lease", a.leases),
            ("keeps expiring streams", a.journals),
        ]
        out.append(f"{service}: " + "; ".join(f"{w} {', '.join(k)}" for w, k in parts if k))
    return "\n".join(out)


@dataclass(frozen=True)
class Credentials:
    """A Redis user and its password, read from `password_file` (a `klet.bus.Bus`
    connects with it; the password never goes on a command line)."""

    username: str
    password_file: Path
    password: str = field(repr=False, default="")
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @classmethod
    def from_file(cls, username: str, password_file: Path) -> Credentials:
        return cls(username, password_file, read_password(password_file))


def read_password(path: Path) -> str:
    """The password in `path`: its first line, without the line break."""
    text = path.read_text()
    return text.splitlines()[0] if text else ""

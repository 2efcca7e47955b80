"""`klet bus-acl`: the Redis ACL users of a node's services, for a Redis klet does not start.

`klet up` configures its private Redis itself. An operator who runs the bus on a Redis
of their own (shared by several nodes, or remote with TLS) runs this once per node: it
writes one random password per service into `<secrets-dir>/<node>/<service>` (0600, in
0700 directories; an existing file is kept, so re-running it is safe) and prints the
ACL file lines of those users (passwords as SHA-256 hashes) from klet.bus.acl, the same
grants `klet up` uses. Each service is then started with `--redis-username` and
`--redis-password-file` pointing at its own file.

The services run no Lua of their own: their fenced writes and leases are the functions
of klet's library (klet.bus.functions), which must be loaded into the Redis with an
admin credential after every start of a Redis that does not persist it.

With `--acl-file` it also writes a whole ACL file for `redis-server --aclfile` (0600):
the unauthenticated `default` user off, then those users; with `--admin-password-file`
as well, the admin user `klet-admin` (password from that file, made if missing), for a
start script that loads the library. `--functions-file` writes the library's text, for
`redis-cli -x FUNCTION LOAD REPLACE`. docker-compose.yml and the chart run it as a
one-shot step before the Redis starts.

With `--apply URL` it connects to that Redis as `--admin-username` (password from
`--admin-password-file`), creates or resets each service user of each node with
ACL SETUSER, and loads the library: the init step for an external Redis, whose admin
credential the services never see.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from klet.bus.acl import (
    ADMIN_USER,
    SERVICES,
    Credentials,
    admin_line,
    check_node,
    describe,
    password_hash,
    read_password,
    service_line,
    service_rules,
    user_name,
)
from klet.bus.functions import LIBRARY, library_code
from klet.config.settings import loopback
from klet.devstack.redis_server import write_secret


def _password(path: Path) -> str:
    """The password in `path`, made (random, 0600) if the file is missing."""
    if not path.exists():
        write_secret(path, secrets.token_urlsafe(32))
    return read_password(path)


def node_acl_lines(node: str, secrets_dir: Path) -> list[str]:
    """ACL file lines of `node`'s service users; creates missing password files."""
    return [
        service_line(node, service, _password(secrets_dir / node / service)) for service in SERVICES
    ]


async def apply(url: str, admin: Credentials, nodes: Sequence[str], secrets_dir: Path) -> list[str]:
    """Create or reset the service users of `nodes` on the Redis at `url` and load the
    function library, as `admin`. Returns the users set."""
    from klet.bus.redisbus import Bus, load_functions, set_user

    bus = Bus.from_url(url, nodes[0], auth=admin, timeout_s=10.0)
    done = []
    try:
        for node in nodes:
            for service in SERVICES:
                password = _password(secrets_dir / node / service)
                name = user_name(node, service)
                rules = ["on", password_hash(password), *service_rules(node, service)]
                await set_user(bus.client, name, rules)
                done.append(name)
        await load_functions(bus.client)
    finally:
        await bus.close()
    return done


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="klet bus-acl",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog="What each service may do on its node's keys:\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node", action="append", required=True, help="node name; repeatable")
    parser.add_argument(
        "--secrets-dir", required=True, type=Path, help="where the password files go"
    )
    parser.add_argument(
        "--acl-file",
        type=Path,
        help="also write a whole ACL file (default user off, then these users) here",
    )
    parser.add_argument(
        "--admin-password-file",
        type=Path,
        help="the admin's password (made if missing): with --acl-file the admin user is "
        "in the file; with --apply it is the credential used",
    )
    parser.add_argument(
        "--functions-file", type=Path, help="write klet's Redis function library here"
    )
    parser.add_argument(
        "--apply",
        metavar="URL",
        help="set the users and load the library on the Redis at URL (redis://, rediss://, "
        "unix://) as the admin",
    )
    parser.add_argument("--admin-username", default=ADMIN_USER, help="with --apply")
    parser.add_argument("--redis-ca-file", type=Path, help="with --apply to rediss://")
    parser.add_argument("--redis-cert-file", type=Path, help="client certificate, rediss://")
    parser.add_argument("--redis-key-file", type=Path, help="its key")
    parser.add_argument(
        "--allow-insecure-redis",
        action="store_true",
        help="with --apply: allow redis:// (a password in clear) to a non-loopback host",
    )
    return parser


def bus_acl(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    try:
        nodes = [check_node(n) for n in args.node]
    except ValueError as err:
        print(f"klet bus-acl: --node: {err}", file=sys.stderr)
        return 2
    if args.apply:
        return _apply(args, nodes)
    out = []
    users = ["user default off"]
    if args.admin_password_file is not None:
        if args.acl_file is None:
            parser.error("--admin-password-file needs --acl-file or --apply")
        users.append(admin_line(_password(args.admin_password_file)))
    for node in nodes:
        out.append(f"# klet node {node}: " + ", ".join(user_name(node, s) for s in SERVICES))
        lines = node_acl_lines(node, args.secrets_dir)
        out += lines
        users += lines
    if args.acl_file is not None:
        write_secret(args.acl_file, "\n".join(users))
    if args.functions_file is not None:
        args.functions_file.parent.mkdir(parents=True, exist_ok=True)
        args.functions_file.write_text(library_code())
        args.functions_file.chmod(0o644)
    print("\n".join(out))
    return 0


def _apply(args: argparse.Namespace, nodes: list[str]) -> int:
    if args.admin_password_file is None:
        print("klet bus-acl: --apply needs --admin-password-file", file=sys.stderr)
        return 2
    parts = urlsplit(args.apply)
    if parts.username or parts.password:
        print("klet bus-acl: --apply: no credentials in the URL", file=sys.stderr)
        return 2
    if parts.scheme == "redis" and not loopback(parts) and not args.allow_insecure_redis:
        print(
            f"klet bus-acl: --apply: {parts.hostname} is not loopback and redis:// sends the "
            "admin password in clear: use rediss:// (--redis-ca-file), or pass "
            "--allow-insecure-redis",
            file=sys.stderr,
        )
        return 2
    try:
        password = read_password(args.admin_password_file)
    except OSError as err:
        print(f"klet bus-acl: --admin-password-file: {err}", file=sys.stderr)
        return 2
    admin = Credentials(
        args.admin_username,
        args.admin_password_file,
        password,
        ca_file=args.redis_ca_file,
        cert_file=args.redis_cert_file,
        key_file=args.redis_key_file,
    )
    from klet.bus.redisbus import BusError

    try:
        users = asyncio.run(apply(args.apply, admin, nodes, args.secrets_dir))
    except BusError as err:
        print(f"klet bus-acl: --apply {args.apply}: {err}", file=sys.stderr)
        return 1
    print("\n".join(f"set {u}" for u in users))
    print(f"loaded {LIBRARY}")
    return 0

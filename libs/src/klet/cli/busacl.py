"""`klet bus-acl`: the Redis ACL users of a node's services, for a Redis klet does not start.

`klet up` configures its private Redis itself. An operator who runs the bus on a Redis
of their own (shared by several nodes, or remote with TLS) runs this once per node: it
writes one random password per service into `<secrets-dir>/<node>/<service>` (0600, in
0700 directories; an existing file is kept, so re-running it is safe) and prints the
ACL file lines of those users (passwords as SHA-256 hashes) from klet.bus.acl, the same
grants `klet up` uses. Each service is then started with `--redis-username` and
`--redis-password-file` pointing at its own file.

With `--acl-file` it also writes a whole ACL file for `redis-server --aclfile` (0600):
the unauthenticated `default` user off, then those users. docker-compose.yml runs it as
a one-shot step before the Redis starts.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

from klet.bus.acl import SERVICES, check_node, describe, read_password, service_line, user_name
from klet.devstack.redis_server import write_secret


def node_acl_lines(node: str, secrets_dir: Path) -> list[str]:
    """ACL file lines of `node`'s service users; creates missing password files."""
    lines = []
    for service in SERVICES:
        path = secrets_dir / node / service
        if not path.exists():
            write_secret(path, secrets.token_urlsafe(32))
        lines.append(service_line(node, service, read_password(path)))
    return lines


def bus_acl(argv: Sequence[str]) -> int:
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
    args = parser.parse_args(list(argv))
    try:
        nodes = [check_node(n) for n in args.node]
    except ValueError as err:
        print(f"klet bus-acl: --node: {err}", file=sys.stderr)
        return 2
    out = []
    users = ["user default off"]
    for node in nodes:
        out.append(f"# klet node {node}: " + ", ".join(user_name(node, s) for s in SERVICES))
        lines = node_acl_lines(node, args.secrets_dir)
        out += lines
        users += lines
    if args.acl_file is not None:
        write_secret(args.acl_file, "\n".join(users))
    print("\n".join(out))
    return 0

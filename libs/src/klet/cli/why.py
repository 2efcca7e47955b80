"""`klet why <namespace>/<pod> [-o json]`: a pod's whole story, the answer first.

status-reporter's leader keeps each pod's history on the bus (every Event any service
recorded about it, each container start, exit, wait and readiness change, each phase
change; klet.model.podhistory); this reads it with XREVRANGE and HGETALL, so it takes
nothing from anyone and works in both modes, on a standby's bus credential too. The
bus and the credential are found as `klet events` finds them (klet.cli.events), e.g.
status-reporter's user inside its container. `<pod>` may also be the pod's UID; `-n`
gives the namespace the way kubectl does (default "default").

What a history holds comes largely from pods (termination messages, probe output), so
the text output shows control characters escaped, never raw (klet.model.podhistory
`printable`: a terminal escape in a termination message cannot reach the terminal);
`-o json` escapes them as JSON does.

Exit status: 0 with the story, 1 when no history is kept of that pod (or the bus
cannot be read), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from klet.cli.events import (
    BusAccess,
    UsageError,
    add_bus_arguments,
    bus_access,
    nodes_hint,
    settle_node,
)
from klet.model.podhistory import printable, render_text
from klet.model.timestamps import rfc3339


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="klet why",
        description="A pod's history on this node, with the answer first: why it restarted, "
        "was killed, evicted, or does not start.",
    )
    p.add_argument("pod", help="<namespace>/<name>, <name> (with -n) or the pod's UID")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    add_bus_arguments(p)
    return p


async def run(access: BusAccess, namespace: str, name: str, *, output: str, out: TextIO) -> bool:
    """Print the story; False when no history of that pod is kept."""
    from klet.bus.history import found_json, pod_story
    from klet.bus.redisbus import Bus
    from klet.bus.schema import NodeBus

    bus = Bus.from_url(access.url, access.node, auth=access, timeout_s=5.0)
    try:
        found = await pod_story(NodeBus.of(bus, service="status-reporter"), namespace, name)
    finally:
        await bus.close()
    if found is None:
        return False
    if output == "json":
        out.write(json.dumps(found_json(found), indent=2) + "\n")
        return True
    out.write(render_text(found.story))
    for uid, row in found.earlier:
        last = rfc3339(row.last_at)
        out.write(printable(f"(an earlier pod of that name: uid {uid}, last entry {last})") + "\n")
    if found.skipped:
        out.write(f"({found.skipped} entries of the history did not decode and are left out)\n")
    return True


def why(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(list(argv))
    namespace, slash, name = args.pod.partition("/")
    if not slash:
        namespace, name = args.namespace, args.pod
    if not namespace or not name:
        print(f"klet why: {args.pod!r} is not <namespace>/<name>", file=sys.stderr)
        return 2
    try:
        access = bus_access(args, os.environ if env is None else env)
    except UsageError as err:
        print(f"klet why: {err}", file=sys.stderr)
        return 2
    from klet.bus.redisbus import BusError

    try:
        access = asyncio.run(settle_node(access))
        told = asyncio.run(run(access, namespace, name, output=args.output, out=sys.stdout))
        hint = "" if told else asyncio.run(nodes_hint(access))
    except UsageError as err:
        print(f"klet why: {err}", file=sys.stderr)
        return 2
    except BusError as err:
        print(f"klet why: {access.url} as {access.username or 'default'}: {err}", file=sys.stderr)
        return 1
    if not told:
        print(
            f"klet why: no history of pod {namespace}/{name} on node {access.node} "
            f"(never seen here, or dropped after --pod-history-max-age){hint}",
            file=sys.stderr,
        )
        return 1
    return 0

"""`klet gc --dry-run` and `klet evict --dry-run`: ask the running image-gc and eviction
leaders what they would do now, over their gRPC sockets, and print the answer.

Each service answers with its own decision functions (`GarbageCollector.PlanCollection`,
`Eviction.DryRun`), so the answer is what its next pass would do; nothing is removed,
evicted, written or recorded. The socket is `<run-dir>/grpc/<service>/<service>.sock`;
the run directory is `--run-dir`, else `KLET_RUN_DIR`, else the first of `/run/klet` (a
node) and `.run` (`make run`) that holds the socket. A service that is not running (no
socket, or nothing answering on it) is named with the paths looked at, exit 1, as is
a service that fails to answer (its error printed); a threshold the service refuses is
printed with its reason, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from klet.cli.dryrunview import as_json, evict_text, gc_text
from klet.config.flags import parse_signal_thresholds
from klet.model.layout import EVICTION, IMAGE_GC, grpc_socket
from klet.rpc.eviction import EvictionClient
from klet.rpc.gc import GarbageCollectorClient, InvalidRequest, RpcUnavailable

DEFAULT_RUN_DIRS = (Path("/run/klet"), Path(".run"))
TIMEOUT_S = 60.0


class NotRunning(Exception):
    """The service's socket is missing or nobody answers on it."""


def find_socket(service: str, run_dir: Path | None) -> Path:
    """The service's socket under `run_dir`, else the first default run directory that
    has it; NotRunning names every path looked at."""
    env = os.environ.get("KLET_RUN_DIR")
    dirs = [run_dir] if run_dir is not None else [Path(env)] if env else list(DEFAULT_RUN_DIRS)
    paths = [grpc_socket(d, service) for d in dirs]
    for p in paths:
        if p.exists():
            return p
    looked = ", ".join(str(p) for p in paths)
    raise NotRunning(f"{service} is not running here: no socket at {looked}")


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument(
        "--dry-run",
        action="store_true",
        required=True,
        help="say what the running service would do now; change nothing",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="the node's run directory")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    return p


def gc(argv: list[str]) -> int:
    p = _parser("klet gc")
    p.add_argument(
        "--threshold",
        type=int,
        metavar="PERCENT",
        help="answer for this imageGCHighThresholdPercent (the low one is lowered to it)",
    )
    args = p.parse_args(argv)

    async def ask(socket: Path) -> str:
        client = GarbageCollectorClient(socket, timeout_s=TIMEOUT_S)
        try:
            plan = await client.plan_collection(high_threshold_percent=args.threshold)
        finally:
            await client.close()
        if args.output == "json":
            return as_json(plan, service=IMAGE_GC, socket=str(socket))
        return gc_text(plan)

    return _run("klet gc", IMAGE_GC, args.run_dir, ask)


def evict(argv: list[str]) -> int:
    p = _parser("klet evict")
    p.add_argument(
        "--signal",
        action="append",
        default=[],
        metavar="SIGNAL<VALUE",
        help="answer for this hard threshold instead of the configured ones, as "
        "--eviction-hard spells it (memory.available<2Gi, nodefs.available<10%%); repeatable",
    )
    args = p.parse_args(argv)
    try:
        parse_signal_thresholds(args.signal)
    except ValueError as err:
        print(f"klet evict: --signal: {err}", file=sys.stderr)
        return 2

    async def ask(socket: Path) -> str:
        client = EvictionClient(socket, timeout_s=TIMEOUT_S)
        try:
            result = await client.dry_run(args.signal)
        finally:
            await client.close()
        if args.output == "json":
            return as_json(result, service=EVICTION, socket=str(socket))
        return evict_text(result)

    return _run("klet evict", EVICTION, args.run_dir, ask)


def _run(
    prog: str, service: str, run_dir: Path | None, ask: Callable[[Path], Coroutine[Any, Any, str]]
) -> int:
    try:
        socket = find_socket(service, run_dir)
    except NotRunning as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    try:
        print(asyncio.run(ask(socket)))
    except NotRunning as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except RpcUnavailable as err:
        gone = str(err).startswith(("UNAVAILABLE", "UNIMPLEMENTED", "DEADLINE_EXCEEDED"))
        what = "is not answering at" if gone else "failed to answer at"
        print(f"{prog}: {service} {what} {socket}: {err}", file=sys.stderr)
        return 1
    except InvalidRequest as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    return 0

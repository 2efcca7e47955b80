"""`klet cri-proxy`: serve the CRI allow-list sockets (klet.cri.proxy) until SIGTERM.

Run beside the services by compose and the chart (a container of its own, the only one
besides syncloop that mounts the runtime's socket); `klet up` serves the same proxy in
its own process instead (klet.cli.up says why). Flags are few and its own, not the
kubelet's: the runtime it fronts, where the sockets go, which services get one, and who
owns each socket.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from klet.cri.allowlist import FILTERED_SERVICES
from klet.cri.proxy import CRIProxy, Owner
from klet.model.layout import CRI_PROXY_DIR, cri_proxy_socket

DEFAULT_RUNTIME = "unix:///run/containerd/containerd.sock"


def _socket(text: str) -> tuple[str, Path]:
    service, sep, path = text.partition("=")
    if not sep or service not in FILTERED_SERVICES or not path.startswith("/"):
        raise argparse.ArgumentTypeError(
            f"--socket {text!r}: want SERVICE=/ABSOLUTE/PATH, SERVICE one of "
            + ", ".join(FILTERED_SERVICES)
        )
    return service, Path(path)


def _owner(text: str) -> tuple[str, Owner]:
    service, sep, ids = text.partition("=")
    uid, sep2, gid = ids.partition(":")
    if not sep or not sep2 or not uid.isdigit() or not gid.isdigit():
        raise argparse.ArgumentTypeError(f"--socket-owner {text!r}: want SERVICE=UID:GID")
    return service, Owner(int(uid), int(gid))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="klet cri-proxy",
        description="CRI sockets that pass each reading service only its allowed calls",
    )
    p.add_argument(
        "--container-runtime-endpoint",
        default=DEFAULT_RUNTIME,
        help=f"the runtime's CRI endpoint (default {DEFAULT_RUNTIME})",
    )
    p.add_argument(
        "--image-service-endpoint",
        default="",
        help="the image service's endpoint, when not the runtime's",
    )
    p.add_argument(
        "--run-dir",
        default="/run/klet",
        help=f"the sockets go in <run-dir>/{CRI_PROXY_DIR}/<service>.sock (default /run/klet)",
    )
    p.add_argument(
        "--service",
        action="append",
        choices=FILTERED_SERVICES,
        help="a service to serve (repeat; default: all of " + ", ".join(FILTERED_SERVICES) + ")",
    )
    p.add_argument(
        "--socket",
        action="append",
        type=_socket,
        default=[],
        metavar="SERVICE=PATH",
        help="serve that service on PATH instead of <run-dir>/cri/<service>.sock "
        "(a volume shared with that service's container alone)",
    )
    p.add_argument(
        "--socket-owner",
        action="append",
        type=_owner,
        default=[],
        metavar="SERVICE=UID:GID",
        help="that service's socket is uid:gid's, 0660 (default: the proxy's own, 0600)",
    )
    return p


def cri_proxy(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    services = tuple(args.service or FILTERED_SERVICES)
    owners = dict(args.socket_owner)
    paths = dict(args.socket)
    for flag, named in (("--socket-owner", owners), ("--socket", paths)):
        unknown = sorted(set(named) - set(services))
        if unknown:
            print(
                f"klet cri-proxy: {flag} names {', '.join(unknown)}, which it does not serve",
                file=sys.stderr,
            )
            return 2
    run_dir = Path(args.run_dir)
    proxy = CRIProxy(
        runtime_endpoint=args.container_runtime_endpoint,
        image_endpoint=args.image_service_endpoint,
        sockets={s: paths.get(s) or cri_proxy_socket(run_dir, s) for s in services},
        owners=owners,
    )
    return asyncio.run(_main(proxy))


async def _main(proxy: CRIProxy) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await proxy.serve(stop)
    return 0


if __name__ == "__main__":  # `python -m klet.cli.criproxy`, as `klet cri-proxy`
    sys.exit(cri_proxy(sys.argv[1:]))

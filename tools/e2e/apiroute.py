"""The `kubernetes` Service for the pods of a conformance run: in-cluster clients reach
the test apiserver at its ClusterIP.

The test control plane's apiserver listens on the loopback only, and no kube-proxy runs,
so a pod that uses its in-cluster configuration (`KUBERNETES_SERVICE_HOST`, the Service's
ClusterIP 10.0.0.1, port 443: the CSI sidecars the storage suite deploys) reaches nothing,
or whatever else answers at 10.0.0.1 on the machine's network. A run of the CSI specs
(`--preset storage-csi`) therefore puts a route in place for its own pods and no one
else's:

- a TCP relay on the pod bridge's gateway address (bound with IP_FREEBIND: the bridge
  appears with the first pod) that copies bytes to the apiserver on the loopback; TLS
  goes through untouched, and the apiserver's certificate names 10.0.0.1;
- one iptables DNAT rule, for packets from the run's pod subnet to 10.0.0.1:443 only,
  to that relay, deleted when the run ends (other stacks on the machine have subnets of
  their own and are not affected).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import subprocess
import threading
from collections.abc import Iterator

from klet.devstack import free_port

SERVICE_PORT = 443
IP_FREEBIND = 15  # linux/in.h; Python's socket module does not export it
RULE_COMMENT = "klet-conformance kubernetes Service"


class RouteError(RuntimeError):
    """The route could not be put in place (iptables missing or refused)."""


def dnat_rule(subnet: ipaddress.IPv4Network, service_ip: str, relay: tuple[str, int]) -> list[str]:
    """The nat PREROUTING rule's specification (without -A/-D)."""
    return [
        "PREROUTING",
        "-s",
        str(subnet),
        "-d",
        f"{service_ip}/32",
        "-p",
        "tcp",
        "--dport",
        str(SERVICE_PORT),
        "-m",
        "comment",
        "--comment",
        RULE_COMMENT,
        "-j",
        "DNAT",
        "--to-destination",
        f"{relay[0]}:{relay[1]}",
    ]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


class Relay:
    """A TCP relay to `target` on a socket bound (freebind) to `address`, served by an
    event loop on a thread of its own until `stop`."""

    def __init__(self, address: str, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
        self.sock.bind((address, free_port()))
        self.address: tuple[str, int] = self.sock.getsockname()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def start(self) -> None:
        self.thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, sock=self.sock), self.loop
        )
        self._server = started.result(timeout=10)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            # The connections still open (watches): ended here, not left to the loop's end.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def _iptables(action: str, rule: list[str]) -> None:
    res = subprocess.run(
        ["iptables", "-w", "-t", "nat", action, *rule], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RouteError(f"iptables -t nat {action} {' '.join(rule)}: {res.stderr.strip()}")


@contextlib.contextmanager
def kubernetes_service(
    *, subnet: ipaddress.IPv4Network, gateway: str, service_ip: str, apiserver_port: int
) -> Iterator[tuple[str, int]]:
    """While open, the run's pods reach the apiserver at `service_ip`:443; yields the
    relay's address."""
    relay = Relay(gateway, ("127.0.0.1", apiserver_port))
    relay.start()
    rule = dnat_rule(subnet, service_ip, relay.address)
    try:
        _iptables("-I", rule)
        try:
            yield relay.address
        finally:
            _iptables("-D", rule)
    finally:
        relay.stop()

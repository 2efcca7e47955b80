"""`klet why` and `klet events` find their node on a real Redis (issue 41 item 6).

A node started by `klet up --hostname-override=<name>` keeps its data under that name,
not the machine's hostname. Given only `--run-dir` (the admin of `klet up`'s Redis, from
its endpoints.json), the commands take the bus's only node; with several and none the
hostname, they refuse naming them; `klet why` not finding a pod on the node it was told
names the nodes the bus holds.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest
from klet.bus.redisbus import Bus
from klet.bus.schema import NodeBus
from klet.cli.events import events
from klet.cli.why import why
from klet.devstack import RedisServer
from klet.model.records import EventRecord

pytestmark = pytest.mark.integration

NODE = "overridden-node"


def run_dir(tmp_path: Path, redis: RedisServer) -> Path:
    """What `klet up` leaves for the commands: endpoints.json naming its Redis and admin."""
    run = tmp_path / "run"
    run.mkdir()
    endpoints = {
        "redis_url": redis.url,
        "redis_admin_password_file": str(redis.admin.password_file),
    }
    (run / "endpoints.json").write_text(json.dumps(endpoints))
    return run


def record_event(redis: RedisServer, node: str) -> None:
    async def publish() -> None:
        bus = Bus.from_url(redis.url, node, auth=redis.admin)
        try:
            event = EventRecord(
                type="Normal",
                reason="Started",
                message="Started container main",
                involved={"kind": "Pod", "namespace": "default", "name": "web", "uid": "u1"},
                component="kubelet",
                at=time.time(),
            )
            await NodeBus.of(bus, service="syncloop").events.publish(event)
        finally:
            await bus.close()

    asyncio.run(publish())


def test_the_only_node_on_the_bus_is_taken(
    tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert socket.gethostname().lower() != NODE
    record_event(redis_server, NODE)
    run = run_dir(tmp_path, redis_server)

    assert events(["--run-dir", str(run)], env={}) == 0
    out = capsys.readouterr().out
    assert "Started container main" in out

    assert why(["default/gone", "--run-dir", str(run)], env={}) == 1
    err = capsys.readouterr().err
    assert f"no history of pod default/gone on node {NODE} " in err
    assert "nodes on this bus" not in err  # it is on the node the bus holds

    # told another node: the answer names the one there is
    assert why(["default/gone", "--run-dir", str(run), "--node", "elsewhere"], env={}) == 1
    err = capsys.readouterr().err
    assert "on node elsewhere " in err
    assert err.rstrip().endswith(f"nodes on this bus: {NODE}")


def test_several_nodes_and_not_the_hostname_is_refused_naming_them(
    tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    record_event(redis_server, NODE)
    record_event(redis_server, "second-node")
    run = run_dir(tmp_path, redis_server)
    for command in (events, why):
        argv = ["--run-dir", str(run)] if command is events else ["p", "--run-dir", str(run)]
        assert command(argv, env={}) == 2
        err = capsys.readouterr().err
        assert f"{NODE}, second-node" in err  # sorted
        assert "give --node" in err
    # --node settles it
    assert events(["--run-dir", str(run), "--node", "second-node"], env={}) == 0
    assert "Started container main" in capsys.readouterr().out

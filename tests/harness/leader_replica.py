"""One replica of a leader-elected service, reduced to what fencing is about: the real
leader loop (`klet.bus.leader.hold`) and a writer per bus write path (a stream entry, a table
put, a transaction) that keeps writing while elected, each record tagged with this
replica's name. Run as a process by tests/integration/test_fencing.py
and test_failover.py:

    python -m tests.harness.leader_replica REDIS_URL NODE NAME TTL_MS USER PASSWORD_FILE [RUN_DIR]

Without RUN_DIR the holder ID is `NAME:TTL_MS` and the lease has no slots; with it, the
lease comes from `klet.bus.service_lease` as a service's does (a unique holder ID, the
replica slot and the leader slot in RUN_DIR). It exits non-zero when it steps down, like
a service under `run_supervised`, and gives the lease and the leader slot back on the
way out, as the services do.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from klet.bus import Bus, BusError, service_lease
from klet.bus.acl import Credentials
from klet.bus.leader import hold, release_quietly
from klet.model.records import NodeConditionRecord
from klet.obs import run_supervised

LEASE = "fencing-test"


async def replica(
    url: str, node: str, name: str, ttl_ms: int, auth: Credentials, run_dir: Path | None
) -> None:
    bus = Bus.from_url(url, node, auth=auth, timeout_s=1.0)
    # The longest a stream may be (klet.bus.functions.MAX_STREAM_LEN).
    writes = bus.stream("fencing-writes", NodeConditionRecord, maxlen=100_000)
    table = bus.table("fencing-leader", NodeConditionRecord)
    if run_dir is None:
        lease = bus.lease(LEASE, f"{name}:{ttl_ms}", ttl_ms=ttl_ms)
    else:
        lease = service_lease(bus, LEASE, run_dir, ttl_ms=ttl_ms)
    elected = asyncio.Event()

    async def writer(path: str) -> None:
        # One task per write path, as a service's root tasks write independently.
        await elected.wait()
        n = 0
        while True:
            n += 1
            record = NodeConditionRecord(type="Fencing", status="True", at=float(n), reason=name)
            try:
                if path == "publish":
                    await writes.publish(record)
                elif path == "put":
                    await table.put("leader", record)
                else:
                    async with bus.transaction() as tx:
                        tx.publish(writes, record)
                        tx.put(table, "leader", record)
            except BusError as err:
                print(f"{name}: {path} {n} failed: {type(err).__name__}: {err}", flush=True)
            await asyncio.sleep(0.02)

    try:
        await run_supervised(
            {
                "lease": hold(lease, elected),
                **{f"writer-{p}": writer(p) for p in ("publish", "put", "transaction")},
            }
        )
    finally:
        await release_quietly(lease)
        await bus.close()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    # "standing by for the lease" (DEBUG): what the test waits on before it stalls the leader.
    logging.getLogger("klet.bus.leader").setLevel(logging.DEBUG)
    url, node, name, ttl_ms, user, password_file = sys.argv[1:7]
    run_dir = Path(sys.argv[7]) if len(sys.argv) > 7 else None
    auth = Credentials.from_file(user, Path(password_file))
    asyncio.run(replica(url, node, name, int(ttl_ms), auth, run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())

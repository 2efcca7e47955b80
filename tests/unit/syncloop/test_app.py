"""syncloop's root tasks (app.py): what the orphan sweep of pod directories leaves alone.

Covers `pods_syncloop_holds`: the desired pods, and a removed pod for as long as its
worker is tearing it down (its sandbox already gone, its directory not yet), so the
sweep does not remove that directory beside the worker; once the worker has ended, the
pod is the sweep's again. Over syncloop's production wiring and FakeRuntimeService.
"""

from __future__ import annotations

from pathlib import Path

from klet.cri.types import ContainerState
from klet.model.records import DesiredPod, SourceState
from klet.model.types import PodUID
from klet.syncloop.app import pods_syncloop_holds
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import Clock, Held, pod, until, wire

IMAGE = "registry.klet.test/busybox:1.36"
READY = {"file": SourceState(source="file", ready=True, at=0.0)}


async def test_a_pod_being_removed_is_held_until_its_worker_ends(tmp_path: Path) -> None:
    clock = Clock(1_700_000_000.0)
    cri = FakeRuntimeService(clock=clock.ns)
    cri.add_image(IMAGE)
    controller = wire(tmp_path, cri, clock=clock).controller
    try:
        table = {
            uid: DesiredPod(
                uid=PodUID(uid), pod=pod("app", uid=uid), source="file", hash="h", seen_at=0.0
            )
            for uid in ("kept", "removed")
        }
        controller.apply_desired(table, READY, read_from=controller.generation)
        await until(
            lambda: sum(c.state is ContainerState.RUNNING for c in cri.containers.values()) == 2
        )
        assert pods_syncloop_holds(controller) >= {"kept", "removed"}
        held = Held()
        cri.hooks["RemovePodSandbox"] = held
        del table["removed"]
        controller.apply_desired(table, READY, read_from=controller.generation)
        await until(lambda: held.in_flight == 1)  # its sandbox is on its way out
        assert "removed" not in controller.desired
        assert pods_syncloop_holds(controller) >= {"kept", "removed"}
        held.release.set()
        await until(lambda: "removed" not in controller.workers.uids())
        assert "removed" not in pods_syncloop_holds(controller)
        assert "kept" in pods_syncloop_holds(controller)
    finally:
        await controller.workers.stop()

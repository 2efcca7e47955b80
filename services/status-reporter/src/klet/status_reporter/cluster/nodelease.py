"""The node Lease heartbeat (`coordination.k8s.io/v1` Lease `<node>` in kube-node-lease).

Upstream's lease controller (`component-helpers/apimachinery/lease`) restated:
the Lease is created when missing, with holderIdentity = the node name,
leaseDurationSeconds = nodeLeaseDurationSeconds (40) and an owner reference to the
Node (so it goes when the Node goes); it is renewed every duration × 0.25 (10 s) by
writing renewTime (MicroTime, microseconds) back with an update that carries the
resourceVersion we last saw, so a concurrent writer makes us re-read rather than
overwrite. A Lease created before the Node was known gets its owner reference on a
later renewal.

The renewal runs on its own schedule, independent of the node status loop: the node
lifecycle controller reads the Lease as "the kubelet is alive" and must not see a gap
because a status update was slow. An apiserver outage is retried with back-off
through klet's one retry policy (`klet.retry`: at most `backoff.max_s` apart, so the
heartbeat resumes within seconds of the apiserver's return) and logged once when it
starts and once when it ends.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from klet.kube import Conflict, KubeError, NotFound
from klet.model.flowcontrol import BackoffPolicy
from klet.model.timestamps import micro_time
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.retry import call_retrying
from klet.status_reporter.cluster.kubeapi import LEASE_NAMESPACE, KubeApi
from klet.status_reporter.cluster.nodeid import NodeIdentity

log = logging.getLogger(__name__)

RENEW_FRACTION = 0.25


def owner_reference(node_name: str, node_uid: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}


def new_lease(node_name: str, *, duration_s: int, now: float, node_uid: str | None) -> JSON:
    """The Lease to create."""
    meta: JSON = {"name": node_name, "namespace": LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [owner_reference(node_name, node_uid)]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": node_name,
            "leaseDurationSeconds": duration_s,
            "renewTime": micro_time(now),
        },
    }


def renewed(
    lease: JSON, node_name: str, *, duration_s: int, now: float, node_uid: str | None
) -> JSON:
    """`lease` renewed at `now` (and owned by the Node once its UID is known)."""
    out = copy.deepcopy(lease)
    spec = out.setdefault("spec", {})
    spec["holderIdentity"] = node_name
    spec["leaseDurationSeconds"] = duration_s
    spec["renewTime"] = micro_time(now)
    meta = out.setdefault("metadata", {})
    if node_uid and not meta.get("ownerReferences"):
        meta["ownerReferences"] = [owner_reference(node_name, node_uid)]
    return out


@dataclass(frozen=True)
class LeasePolicy:
    duration_s: int = 40
    """nodeLeaseDurationSeconds."""
    backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(0.2, 5.0))
    """Retry delays while the apiserver does not answer."""

    @property
    def renew_interval_s(self) -> float:
        return self.duration_s * RENEW_FRACTION


class LeaseManager:
    """Keeps the node's Lease renewed; `renew_once` is one step, `run` the loop."""

    def __init__(
        self,
        *,
        api: KubeApi,
        identity: NodeIdentity,
        policy: LeasePolicy = LeasePolicy(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._identity = identity
        self._policy = policy
        self._clock = clock
        self._lease: JSON | None = None
        self._once = OnceLogger(log, level=logging.WARNING)
        self.renewed_at: float | None = None
        """Wall time of the last successful write."""

    async def renew_once(self) -> None:
        """Create or renew the Lease. Raises KubeError (the last lease is re-read next)."""
        name = self._identity.name
        duration = self._policy.duration_s
        if self._lease is None:
            try:
                self._lease = await self._api.get_lease(name)
            except NotFound:
                now = self._clock()
                self._lease = await self._api.create_lease(
                    new_lease(name, duration_s=duration, now=now, node_uid=self._identity.uid)
                )
                self.renewed_at = now
                log.info("node lease created", extra={"lease": f"{LEASE_NAMESPACE}/{name}"})
                return
        now = self._clock()
        body = renewed(self._lease, name, duration_s=duration, now=now, node_uid=self._identity.uid)
        try:
            self._lease = await self._api.replace_lease(body)
        except (Conflict, NotFound):
            self._lease = None  # someone else wrote it, or it was deleted: re-read
            raise
        self.renewed_at = now

    async def run(self) -> None:
        """Renew every renew_interval_s until cancelled; back off while failing."""
        while True:
            await call_retrying(
                self.renew_once, self._policy.backoff, on=KubeError, on_failure=self._failed
            )
            self._once.clear("lease", "node lease renewed again")
            await asyncio.sleep(self._policy.renew_interval_s)

    def _failed(self, err: BaseException | None) -> None:
        self._once.error(
            "lease", f"failed to renew the node lease: {type(err).__name__}", error=str(err)
        )

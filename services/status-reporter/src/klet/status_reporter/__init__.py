"""status-reporter: everything the outside world sees of this node and its pods.

Always (standalone and cluster): an in-memory view of the node's pods, built from the
bus's `desired` and `status` tables and refreshed by the `podstatus` stream
(`podcache.py`, rules in `listing.py`), served on the kubelet's read-only and healthz
endpoints (`api.py`).

Cluster mode (a kubeconfig is set; `cluster.py` wires it): the Node registered and its
status kept current (`nodemanager.py` over the pure `nodestatus.py`/`capacity.py`, host
facts from `hostinfo.py`, runtime and contributed conditions from `nodeobserver.py`),
the node Lease (`nodelease.py`), pod statuses, mirror pods and final deletions
(`podsync.py` over the pure `podstatus.py`/`mirrors.py`), and Events from the bus's
`events` stream (`eventsink.py` over the pure `events.py`). Every apiserver call goes
through `kubeapi.py` (klet.kube underneath).

Entry point: `python -m klet.status_reporter` (or the `klet.services` entry point of
the same name).
"""

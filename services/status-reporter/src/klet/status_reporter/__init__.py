"""status-reporter: everything the outside world sees of this node and its pods.

Its modules stand in rooms by role (ARCHITECTURE.md, "Inside status-reporter"), with
`app.py`, `wiring.py` and `__main__.py` on top:

- `pods/`, always (standalone and cluster): the in-memory view of the node's pods, built
  from the bus's `desired` and `status` tables and refreshed by the `podstatus` stream
  (`podcache.py`, rules in `listing.py`), and each pod's history for `klet why`
  (`history.py`).
- `cluster/`, cluster mode (a kubeconfig is set; `managers.py` wires it): the Node
  registered and its status kept current (`nodemanager.py` over the pure
  `nodestatus.py`/`capacity.py`, host facts from `hostinfo.py`, runtime and contributed
  conditions from `nodeobserver.py`), the node Lease (`nodelease.py`), pod statuses,
  mirror pods and final deletions (`podsync.py` over the pure
  `podstatus.py`/`mirrors.py`), CSINode (`csinode.py`) and Events from the bus's
  `events` streams (`eventsink.py` over the pure `eventbodies.py`). Every apiserver
  call goes through `kubeapi.py` (klet.kube underneath).
- `tables/`: bus tables polled into memory (the pods' volumes, the device plugins'
  resources) for the Node status and /stats/summary.
- `metrics/`: this service's Prometheus instruments and the node's merged exposition.
- `kubeletapi/`: the kubelet API on 10250, and the read-only and healthz ports
  (`readonly.py`).

Entry point: `python -m klet.status_reporter` (or the `klet.services` entry point of
the same name).
"""

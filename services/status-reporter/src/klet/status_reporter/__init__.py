"""status-reporter: everything the outside world sees of this node's pods.

In standalone mode (this package today) it keeps an in-memory view of the node's pods,
built from the bus's `desired` and `status` tables and refreshed by the `podstatus`
stream, and serves it on the kubelet's read-only and healthz endpoints. Entry point:
`python -m klet.status_reporter` (or the `klet.services` entry point of the same name).
"""

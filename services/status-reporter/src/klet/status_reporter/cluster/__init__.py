"""Cluster mode: everything status-reporter writes to the apiserver.

The Node (registration, status, the node Lease, CSINode), the pods' statuses, mirror
pods and final deletions, and the services' Events; `managers.py` builds them over one
`kubeapi.KubeApi` and one `nodeid.NodeIdentity`. Pod status sync lives here rather than
in `pods/` because it is an apiserver writer like the others and shares their client and
the Node's identity; it reads the pod view through its own `PodView` Protocol, so
`cluster/` and `pods/` never import each other.
"""

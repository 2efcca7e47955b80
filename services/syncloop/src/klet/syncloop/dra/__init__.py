"""Dynamic Resource Allocation on the node (upstream's pkg/kubelet/cm/dra): DRA drivers
registering through the plugin watcher (`registration.py`) and what klet keeps of the
claims they prepared (`claiminfo.py`, checkpointed in `<root-dir>/dra_manager_state`),
the checks a claim read from the apiserver passes before it is prepared for a pod
(`claims.py`), and the CDI devices a container gets from them (`cdi.py`, into CRI
`CDI_devices`).
Pods with resourceClaims are still refused at admission: nothing prepares their claims
yet."""

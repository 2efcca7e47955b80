"""Dynamic Resource Allocation on the node (upstream's pkg/kubelet/cm/dra): DRA drivers
registering through the plugin watcher (`registration.py`) and what klet keeps of the
claims they prepared (`claiminfo.py`, checkpointed in `<root-dir>/dra_manager_state`),
the checks a claim read from the apiserver passes before it is prepared for a pod
(`claims.py`), the CDI devices a container gets from them (`cdi.py`, into CRI
`CDI_devices`), and the manager preparing and unpreparing a pod's claims through the
drivers with the checkpoint kept (`manager.py`), reading the claims from the apiserver
(`apiclaims.py`). The pod path calls the manager: SyncPod prepares before a new
sandbox, container creation takes the CDI devices, a stopped pod's claims are
unprepared (pods/syncpod.py, containers/startcontainer.py, pods/controller.py)."""

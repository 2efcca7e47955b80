"""Stateful fakes of the interfaces klet's services consume, for unit tests (STYLE rule 7).

They live in the test bed, not beside the interfaces they fake, because the test bed is
the one distribution the images do not install: a fake beside its interface ended up in
the wheels and the image. One module per interface owner: `bus` (the Redis bus, its
lease and leader slot), `cri` (the runtime and its event stream), `stats` (cgroup and
runtime stats readers), `cgroups` (systemd's slice manager), `status_reporter` (the
apiserver and the node's runtime as status-reporter sees them), `kubeletapi` (what the
kubelet API reads) and `podapi` (the apiserver pod list and watch pod-source consumes).
The service fakes import the service's own types, which is why the test bed may import a
service where nothing else in it does (pyproject.toml's import-linter contracts).
Integration and cluster tests use the real Redis, containerd and kube-apiserver.
"""

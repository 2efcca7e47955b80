"""klet's test bed: what the tests and benchmarks start besides `klet up`'s own stack.

A distribution of its own (`klet-testbed`) that the workspace installs for development
and the images never ship: a test PKI (`pki`), a private control plane of the real
kube-apiserver, etcd, controller-manager and scheduler with kubeadm's bindings
(`cluster`, `kube_components`) and a private dockerd (`dockerd`) for the compose and
systemd tiers. `klet up`'s private Redis, registry, containerd and CNI network stay in
`klet.devstack` in klet-libs, because the agent runs them.
"""

from __future__ import annotations

from klet.testbed.dockerd import Dockerd

__all__ = ["Dockerd"]

# One vocabulary for people and CI: setup run test lint typecheck proto bench.
SHELL := /bin/bash
PY := .venv/bin/python
RUN_DIR ?= $(CURDIR)/.run
PYTEST_ARGS ?=

.PHONY: setup setup-run run test unit integration cluster soak lint typecheck proto bench bench-gc bench-failover bench-events bench-compare fuzz fuzz-manifests clean image test-image test-compose test-helm test-systemd conformance conformance-storage

setup:
	@bash tools/setup.sh

# What `make run` needs and no more (no docker, mmdebstrap, skopeo: those are the tests'
# and `make image`'s).
setup-run:
	@bash tools/setup.sh --run

# The whole agent on this machine with its embedded defaults: a private Redis, registry
# and containerd under $(RUN_DIR), the example static pods, the read-only API on 10255.
run: setup-run
	.venv/bin/klet up --run-dir $(RUN_DIR) --pod-manifest-path examples/static-pods --read-only-port 10255

# Lint, types, then every tier: unit, integration (real Redis, containerd, registry),
# cluster (a real kube-apiserver + etcd, built once by cluster-binaries), compose
# (the images and docker-compose.yml on a private dockerd), helm (the chart, with the
# helm binaries built once by helm-binaries), conformance and systemd (e2e-binaries).
# tools/test.sh runs the Go builds niced beside the unit and integration tiers, which
# need none of them, then the other tiers. pytest exits 5 when it collected nothing: that
# is a failure here like any other non-zero exit.
test: setup lint typecheck
	bash tools/test.sh $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest -m "not integration and not cluster and not compose and not helm and not systemd" $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

cluster: setup cluster-binaries
	$(PY) -m pytest -m cluster $(PYTEST_ARGS)

# Faults on a loaded node (tests/soak): 110 static pods in cluster mode; every service
# SIGKILLed 10 times, Redis flushed, containerd SIGKILLed 6 times, the apiserver down
# 120 s. Tens of minutes: not part of `make test`. KLET_SOAK_* variables scale it down.
soak: setup cluster-binaries
	KLET_SOAK=1 $(PY) -m pytest tests/soak -s $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check libs services testbed tests bench tools
	.venv/bin/ruff format --check libs services testbed tests bench tools
	.venv/bin/lint-imports

typecheck: setup
	.venv/bin/mypy libs/src testbed/src services/pod-source/src services/syncloop/src services/status-reporter/src services/eviction/src services/image-gc/src tools/container_fields.py tools/config_fields.py tools/upstream_metrics.py tools/upstream_metrics_accounts.py tools/image tools/e2e tools/csi tools/kubeadm \
		bench/common.py bench/run.py bench/gc.py bench/failover.py bench/events.py bench/compare.py bench/memory.py bench/volumes.py bench/cadvisor.py

proto:
	$(PY) tools/gen_proto.py

# The deployment images, with no Docker daemon: klet:<version> (Debian bookworm minbase +
# the locked dependencies + the workspace wheels, entrypoint `klet`) and
# klet-redis:<version>, as OCI archives in .cache/image/ that `docker load`, `ctr images
# import` and `skopeo copy oci-archive:` accept. The rootfs and dependency layers are
# cached under $KLET_CACHE/image (default /var/cache/klet/image); see tools/image. The
# gRPC stubs the libs wheel carries are the ones setup (re)generates when proto/ changed.
image: setup
	$(PY) -m tools.image

# Builds the images and runs them on a private containerd (tests/image); not in `make test` yet.
test-image: setup
	KLET_IMAGE_TESTS=1 $(PY) -m pytest tests/image $(PYTEST_ARGS)

# The compose tier alone: docker-compose.yml on a private dockerd against the test
# stack's containerd and the cluster harness's apiserver; restarts, SIGKILLs, scaled
# replicas losing their leader, a Redis outage and down/up leave the pods alone
# (tests/compose). `make test` runs it under Debian's docker-compose 1.29 only;
# test-compose runs it under 1.29 and then Compose v2 (`docker compose`, the plugin
# compose-v2-binary builds), test-compose-v2 under v2 alone.
test-compose: setup cluster-binaries compose-v2-binary
	KLET_COMPOSE_CLIS=1.29,v2 $(PY) -m pytest tests/compose -s $(PYTEST_ARGS)

.PHONY: test-compose-v2
test-compose-v2: setup cluster-binaries compose-v2-binary
	KLET_COMPOSE_CLIS=v2 $(PY) -m pytest tests/compose/test_compose.py -s $(PYTEST_ARGS)

# Compose v2 (github.com/docker/compose/v2: the docker-compose binary, which is also the
# `docker compose` CLI plugin), built from tools/compose's Go module into
# $KLET_CACHE/compose/<version>/docker-compose; no-op once cached. Not in `make test`: a
# cold build takes about 5 CPU-minutes (tools/compose/build.sh), outside CI's budget.
.PHONY: compose-v2-binary
compose-v2-binary:
	bash tools/compose/build.sh

# The helm tier alone (it is part of `make test` too): `helm lint --strict` of every
# helm/klet/ci/*.yaml on Helm 4 and Helm 3, the `helm template` output checked, and a
# real `helm install` on the full test control plane, its klet managing a node of its
# own on a second containerd (tests/helm).
test-helm: setup cluster-binaries helm-binaries
	$(PY) -m pytest tests/helm $(PYTEST_ARGS)

# The systemd tier alone (it is part of `make test` too): a node container whose PID 1 is
# Debian's systemd (image klet-systemd-node from tools/image) on a private dockerd, klet
# up inside it with cgroupDriver: systemd, joined to a control plane; pods of each QoS
# class in their slices, a removed pod's slice gone, the pod-lifecycle specs of the
# conformance smoke subset; a graceful node shutdown through logind, read from the
# apiserver (tests/systemd, harness tests/harness/systemd_node.py).
# The klet-kubelet .deb (tools/package/build.sh): /usr/bin/kubelet, the kubelet unit and
# kubeadm's drop-in, under .cache/package/ (proof: tests/unit/test_packaging_kubelet.py and
# tests/integration/test_kubelet_entrypoint.py, in make test).
.PHONY: kubelet-package
kubelet-package:
	bash tools/package/build.sh

test-systemd: setup
	$(PY) -m pytest tests/systemd -s $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run.py

# One container GC pass: the decision and a pass at 500 dead containers on the fake
# runtime, and passes on a private real containerd (root); see bench/README.md.
bench-gc: setup
	$(PY) bench/gc.py

# Failover of each leased service: two replicas sharing one run dir, the leader SIGKILLed,
# time until the standby holds the lease and acts (and, for syncloop, reports a container
# that died meanwhile); FAILOVER_ROUNDS (default 5) kills per service. See bench/README.md.
bench-failover: setup
	$(PY) bench/failover.py

# Container death (SIGKILL of its process) → /pods shows it terminated, and → restarted,
# EVENTS_ROUNDS (default 20) pods each with runtime events (the default) and with the
# 1 s relist alone (featureGates.EventedPLEG=false); medians and p99. See bench/README.md.
bench-events: setup
	$(PY) bench/events.py --rounds $(or $(EVENTS_ROUNDS),20)

# klet beside the upstream kubelet (built by tools/cluster/build.sh --with-kubelet when
# missing), each on its own containerd, alternating workloads: pod start (1, bursts), a
# container's death, removal, 110 idle pods (CPU, memory), an agent restart. COMPARE_ROUNDS,
# COMPARE_SINGLES, COMPARE_BURSTS, COMPARE_IDLE_PODS, COMPARE_IDLE_S scale it; see bench/README.md.
bench-compare: setup
	$(PY) bench/compare.py $(COMPARE_ARGS)

# Pod start and deletion with volumes, klet beside the upstream kubelet as two nodes of one
# real control plane (controller-manager: PV binder, protection, ephemeral volumes), each on
# its own containerd with its own csi-mock and csi-provisioner: an emptyDir pod, a pod with
# a Bound CSI claim, a pod with an inline CSI volume; created -> Running+ready, deleted ->
# gone, the CSI Node calls, agent CPU. VOLUMES_ROUNDS (default 30), VOLUMES_WARMUP (1);
# VOLUMES_ARGS passes --keep, --readme. It builds what is missing (the kubelet, the control
# plane, csi-mock, csi-provisioner: no-ops once cached). About 10 minutes. See bench/README.md.
.PHONY: bench-volumes
bench-volumes: setup
	$(PY) bench/volumes.py $(VOLUMES_ARGS)

# Idle memory per process (RSS and PSS from smaps_rollup, median of 5 readings after 60 s
# idle) of `klet up` with 110 pods, standalone (static pods) and in cluster mode (a real
# kube-apiserver, apiserver pods bound by nodeName); MEMORY_MODES picks one, MEMORY_ARGS
# passes options (--pods --idle-s --samples --keep). See bench/README.md.
MEMORY_MODES ?= standalone cluster
.PHONY: bench-memory
bench-memory: setup
	set -e; for mode in $(MEMORY_MODES); do $(PY) bench/memory.py --mode $$mode $(MEMORY_ARGS); done

# Long fuzz runs, not part of `make test` (seeded subsets run in the unit tests); each
# prints its figures and fails on any crash. `fuzz`: 10,000 mutated KubeletConfiguration
# files and 10,000 mutated flag sets through load_settings (tests/fuzz/kubelet_config.py),
# then the manifests. `fuzz-manifests`: 10,000 mutated static pods through the file and
# URL sources (tests/fuzz/manifests.py). FUZZ_SEED picks another reproducible run.
FUZZ_COUNT ?= 10000
FUZZ_SEED ?= 1
fuzz: setup fuzz-manifests
	$(PY) -m tests.fuzz.kubelet_config --count $(FUZZ_COUNT) --seed $(FUZZ_SEED)

fuzz-manifests: setup
	$(PY) -m tests.fuzz.manifests --count $(FUZZ_COUNT) --seed $(FUZZ_SEED)

# Kubernetes' own [NodeConformance] e2e tests (e2e.test v1.34) against klet: a private dev
# stack with the suite's images, a control plane with controller-manager and scheduler,
# `klet up` as the node; writes conformance/RESULTS.md (and the JUnit, JSON report and
# logs under conformance/run/). About 20 minutes with 4 ginkgo processes on 2 cores;
# not part of `make test`, which runs a smoke subset (tests/conformance).
# CONFORMANCE_ARGS: e.g. --focus 'Downward API' --procs 1.
CONFORMANCE_ARGS ?= --procs 4
conformance: setup cluster-binaries e2e-binaries
	$(PY) -m tools.e2e.conformance $(CONFORMANCE_ARGS)

# The storage e2e specs of the same suite against klet's volume manager: the runnable
# (not Serial, Disruptive, Slow, Flaky or Feature-gated) specs of `[sig-storage]
# PersistentVolumes-local` (34) and `PersistentVolumes` (12; the NFS server image of its
# NFS specs, volume/nfs, is built offline too), in a PID and mount namespace of its own (the
# specs' hostexec pods nsenter /proc/1's mount namespace, which this VM's PID 1 refuses);
# writes conformance/storage/RESULTS.md (artefacts under conformance/storage/run/). About
# 50 minutes with 2 ginkgo processes, mostly the 300 s waits of the specs that fail here.
# CONFORMANCE_STORAGE_ARGS: e.g. --focus 'Volume type: dir\]' --procs 1.
CONFORMANCE_STORAGE_ARGS ?= --procs 2
conformance-storage: setup cluster-binaries e2e-binaries
	$(PY) -m tools.e2e.conformance --preset storage $(CONFORMANCE_STORAGE_ARGS)

# The runnable [Driver: csi-hostpath] (100) and CSI Mock (57) specs of upstream's storage
# suite: the drivers are deployed as the suite deploys them, from the CSI images tools/csi
# builds (`make csi-binaries` first: minutes cold), and the run's pods get the kubernetes
# Service (tools/e2e/apiroute.py). Writes conformance/storage/csi/RESULTS.md. Each spec
# deploys its driver: about 100 s a spec here, so narrow it with --focus.
# CONFORMANCE_STORAGE_CSI_ARGS: e.g. --focus 'csi-hostpath.*block volmode' --procs 2.
.PHONY: conformance-storage-csi
CONFORMANCE_STORAGE_CSI_ARGS ?= --procs 2
conformance-storage-csi: setup cluster-binaries e2e-binaries csi-binaries
	$(PY) -m tools.e2e.conformance --preset storage-csi $(CONFORMANCE_STORAGE_CSI_ARGS)

# The csi-hostpath specs of volume snapshots (snapshottable, provisioning from a snapshot:
# 18, all [Feature:VolumeSnapshotDataSource]) with the snapshot CRDs and snapshot-controller
# in the cluster (tests/harness/snapshots.py). Writes conformance/storage/csi/snapshots/.
.PHONY: conformance-storage-csi-snapshots
conformance-storage-csi-snapshots: setup cluster-binaries e2e-binaries csi-binaries
	$(PY) -m tools.e2e.conformance --preset storage-csi-snapshots $(CONFORMANCE_STORAGE_CSI_ARGS)

# The [DRA] specs of upstream's e2e suite that a default 1.34 cluster runs (65 in v1.34.4,
# the kubelet's [Feature:DynamicResourceAllocation] ones included: --preset dra's focus
# and skip; the two-node ones skip themselves) against a klet node on containerd v2 with
# CDI on (tools/dra/build-containerd.sh: about 7 min the first time, cached after), the test
# driver's kubelet plugin inside e2e.test behind its proxy pod (tools/dra/images.py).
# Writes conformance/dra/RESULTS.md (artefacts under conformance/dra/run/).
.PHONY: conformance-dra
CONFORMANCE_DRA_ARGS ?= --procs 1
conformance-dra: setup cluster-binaries e2e-binaries
	$(PY) -m tools.e2e.conformance --preset dra $(CONFORMANCE_DRA_ARGS)

# The real control plane of the cluster tests (kube-apiserver, kubectl, etcd,
# kube-controller-manager, kube-scheduler), built from tools/cluster's Go modules into
# $KLET_CACHE (default /var/cache/klet); builds only what is missing, a no-op once cached.
# `bash tools/cluster/build.sh --with-kubelet` also builds the upstream kubelet.
.PHONY: cluster-binaries
cluster-binaries:
	bash tools/cluster/build.sh

# kubeadm v1.34.4 from tools/cluster's module into the control plane's bin directory in
# $KLET_CACHE (tools/cluster/build.sh --with-kubeadm); a no-op once cached.
.PHONY: kubeadm-binary
kubeadm-binary:
	bash tools/cluster/build.sh --with-kubeadm

# kubeadm's addons, kube-proxy v1.34.4 and CoreDNS v1.12.1, from tools/kubeadm's Go modules
# into $KLET_CACHE/kubeadm-addons (tools/kubeadm/addons.py); a no-op once cached. Cold on
# 2 cores: kube-proxy ~80 s, CoreDNS 4 min of CPU (14 min wall on a busy machine).
.PHONY: kubeadm-addons
kubeadm-addons: setup
	$(PY) -m tools.kubeadm.addons

# kubeadm init with klet as the node's kubelet (tests/kubeadm/test_kubeadm_init.py): the
# control plane's and the addons' images built from cluster-binaries and kubeadm-addons,
# kubeadm's files and fixed ports kept in a private mount and network namespace (unshare;
# nothing reaches the host); every phase runs (kube-proxy and CoreDNS serve a pod), a
# second node joins, then kubeadm reset and kube-proxy --cleanup; and kubeadm's smoke
# (tests/kubeadm/test_kubeadm_smoke.py: init without the addons, a `kubeadm upgrade`-style
# manifest edit restarting kube-scheduler once, reset), which `make test` runs too
# (tests/kubeadm/test_kubeadm_in_make_test.py, in a namespace of its own). About 120 s +
# the smoke's with the binaries cached.
.PHONY: test-kubeadm
test-kubeadm: setup cluster-binaries kubeadm-binary kubeadm-addons
	KLET_KUBEADM_TESTS=1 unshare --mount --net --propagation private \
		$(PY) -m pytest tests/kubeadm $(PYTEST_ARGS)

# metrics-server, the aggregated metrics API behind `kubectl top` (tests/cluster/
# test_kubectl_top.py runs it against a klet node), from tools/metrics-server's Go module
# into $KLET_CACHE/metrics-server/<version>; no-op once cached.
.PHONY: metrics-server-binary
metrics-server-binary:
	bash tools/metrics-server/build.sh

# `kubectl top` and the node proxy against a klet node (tests/cluster/test_kubectl_top.py:
# the real metrics-server behind the aggregation layer). Its own target, not in `make
# test`: building metrics-server costs about 4 CPU-minutes cold, past CI's 60-minute budget.
.PHONY: test-top
test-top: setup cluster-binaries metrics-server-binary
	KLET_TOP_TESTS=1 $(PY) -m pytest tests/cluster/test_kubectl_top.py $(PYTEST_ARGS)

# Kubernetes' e2e suite (e2e.test), the ginkgo CLI and the agnhost/nnp binaries of its test
# images, from tools/e2e's Go module into $KLET_CACHE/e2e/<k8s>/bin; no-op once cached.
# The images themselves: `python -m tools.e2e.images --registry HOST:PORT --repo-list FILE`.
.PHONY: e2e-binaries
e2e-binaries:
	bash tools/e2e/build.sh

# The CSI components of the storage e2e suite's manifests (csi-provisioner, csi-resizer,
# csi-snapshotter, snapshot-controller), csi-sanity and csi-mock (the suite's mock CSI
# driver as a binary), each from tools/csi/<dir>'s Go module, and the ones the Go module
# proxy does not serve (hostpathplugin, csi-node-driver-registrar, csi-attacher,
# livenessprobe, csi-external-health-monitor-controller) from their release sources in
# ../shared/third_party/kubernetes-csi (or $KLET_CSI_SRC; checked against its SHA256SUMS,
# built with -mod=vendor), into $KLET_CACHE/csi/<name>/<version>; no-op once cached.
# Fails naming what is missing when those sources are not there. Not in `make test`: a
# cold build takes many minutes (tools/csi/README.md).
# The images: `python -m tools.csi.images --registry HOST:PORT`.
.PHONY: csi-binaries csi-test-binaries test-csi
csi-binaries:
	bash tools/csi/build.sh

# The CSI components `make test` runs (csi-mock and csi-sanity in the integration tier,
# csi-provisioner for test_csi_volumes, hostpathplugin for test_csi_database, and
# csi-node-driver-registrar, which registers the drivers of test_csi_database,
# test_csi_registration and test_csi_volumes), built by tools/test.sh in the background
# beside the first session. Without the release sources the last two are left out,
# saying why, and the tests that need them skip with that reason (printed in pytest's
# summary; test_csi_volumes' local-PV tests still run). Two calls: a
# call holds the build lock while it builds, and the integration tier's test_csi_driver
# asks for csi-mock and csi-sanity alone (a call with nothing to build takes no lock).
csi-test-binaries:
	bash tools/csi/build.sh csi-mock csi-sanity
	bash tools/csi/build.sh --skip-absent-sources csi-provisioner hostpathplugin csi-node-driver-registrar

# The tests of those components (their images through CRI, the provisioner and resizer
# against the real apiserver, node-driver-registrar registering a driver with a klet
# node, raw block volumes, a claim restored from a VolumeSnapshot with the snapshot CRDs
# and snapshot-controller in the cluster), which `make test` does not collect
# (tests/conftest.py).
test-csi: setup cluster-binaries csi-binaries
	KLET_CSI_TESTS=1 $(PY) -m pytest tests/integration/test_csi_images.py tests/cluster/test_csi_sidecars.py tests/cluster/test_csi_block.py tests/cluster/test_csi_snapshots.py tests/cluster/test_csi_database.py $(PYTEST_ARGS)

# Upstream's DRA test driver (tools/dra/build.sh builds k8s.io/kubernetes v1.34.4's
# test/e2e/dra/test-driver: about 15 s the first time, cached after) registering through
# klet's plugin watcher and preparing and unpreparing a claim against the cluster
# harness's apiserver (tests/cluster/test_dra_driver.py, about 25 s with the control
# plane's start), and a container created through klet's CRI config with the claim's CDI
# device on containerd v2 (tools/dra/build-containerd.sh: about 7 min the first time,
# cached after; tests/cluster/test_dra_cdi.py, about 15 s), and a pod with a
# ResourceClaimTemplate scheduled onto a klet node on containerd v2, its claim prepared,
# its container given the device, unprepared at deletion and the gone driver's
# ResourceSlice deleted (tests/cluster/test_dra_pods.py, about 3 min with the full
# control plane's start). `make test` runs the DRA unit tests and the DRA smoke
# (tests/cluster/test_controllers.py::test_dra_smoke_...: the same pod path on Debian's
# containerd 1.6, without CDI, about 11 s on that module's node), not this
# (tests/conftest.py).
.PHONY: test-dra
test-dra: setup cluster-binaries dra-binary
	KLET_DRA_TESTS=1 $(PY) -m pytest tests/cluster/test_dra_driver.py tests/cluster/test_dra_cdi.py tests/cluster/test_dra_pods.py $(PYTEST_ARGS)

# Upstream's DRA test driver alone (tools/dra/build.sh; built offline from the Go module
# and build caches the control plane and e2e.test leave, so after them in tools/test.sh's
# background builds): a no-op once cached.
.PHONY: dra-binary
dra-binary:
	bash tools/dra/build.sh

# The pinned helm binaries of the helm tier, built from tools/helm's Go module into
# $KLET_CACHE/helm/<version>/helm (default /var/cache/klet); no-op once cached. v4 renders
# and installs the chart; v3 only proves it still lints on Helm 3. `make run` needs no helm.
.PHONY: helm-binaries
helm-binaries:
	bash tools/helm/build.sh v4
	bash tools/helm/build.sh v3

clean:
	rm -rf .run .cache .venv libs/src/klet/rpc/gen

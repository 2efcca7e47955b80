"""`kubeadm init` (v1.34.4, built by `make kubeadm-binary`) on a node whose kubelet is
klet, started as systemd starts it from the klet-kubelet package (packaging/kubelet: the
unit and kubeadm's drop-in, expanded with the files kubeadm writes).

kubeadm writes where a real node keeps its files (/etc/kubernetes, /var/lib/kubelet,
/var/lib/etcd, /run/klet, /usr/bin/kubelet...) and binds the control plane's fixed ports
(6443, 2379, 2380, 10250, 10257, 10259). So `make test-kubeadm` runs this module in a
private mount and network namespace (`unshare --mount --net`), and the module puts an
overlay over /etc, /var/lib, /var/log, /run and /usr/bin whose upper directories are the
test's own: nothing kubeadm or klet writes reaches the host, and the namespace's end
takes it all away. The network is the namespace's own: loopback and a veth pair, one end
holding the advertise address.

Inside, the dev stack (containerd with its bridge CNI, the registry) serves the control
plane's images that tools/kubeadm/images.py builds from the project's binaries, under
`imageRepository: registry.klet.test/kubeadm`. kubeadm's `systemctl restart kubelet`
has no systemd here (it warns, as upstream does without systemd); the test starts the
kubelet once kubeadm's kubelet-start phase has written its files, which is when systemd
(Restart=always) would have it running. kubeadm runs every phase, the addon phase
included: its kube-proxy and coredns images are built from source too (tools/kubeadm/
addons.py).

Proven: kubeadm init reports success, having seen etcd, kube-apiserver,
kube-controller-manager and kube-scheduler run as static pods by klet (its
wait-control-plane phase); the node registers and is marked control-plane; a pod the
scheduler binds to it (tolerating the control-plane taint) runs. kubeadm's addons run on
klet: the kube-proxy DaemonSet's pod (hostNetwork, privileged, iptables mode on the
namespace's nf_tables) programs the kubernetes Service, so the pod reaches 10.96.0.1:443
(the apiserver's own answer to plain HTTP comes back), and CoreDNS's two replicas turn
Ready and answer `kubernetes.default.svc.cluster.local` = 10.96.0.1 to the pod, whose
resolv.conf names kubeadm's clusterDNS 10.96.0.10. A second node
(tests/kubeadm/joinnode.py: its own namespaces, dev stack and klet) runs `kubeadm join`
with the command `kubeadm token create --print-join-command` prints; it TLS-bootstraps,
turns Ready, and a Deployment of two replicas spread by hostname runs one pod on each
node. Then `kubeadm reset`
(the kubelet stopped first, as systemd would stop it) removes every container through
CRI and leaves no file in /etc/kubernetes, /var/lib/kubelet or /var/lib/etcd and no
mount under /var/lib/kubelet; kube-proxy's iptables rules, which reset leaves (as
upstream's tells), go with `kube-proxy --cleanup` but for its KUBE-FIREWALL chain, which
upstream's cleanup keeps too (the test removes it). What it does not clean, as with
upstream's kubelet: the pod logs in /var/log/pods; and klet's own run dir /run/klet (the
bus's Redis, its password files, leases), which kubeadm does not know (README's Limits).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.devstack.images import TEST_REGISTRY_HOST
from klet.syncloop.volumes.fs import mounts_under

from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods
from tests.kubeadm.kubeadmnode import (
    CACHE,
    NODE,
    REPO,
    Initialized,
    init,
    kubeadm_env,
    reset_leaves_nothing,
    run,
    stop,
)
from tests.kubeadm.kubeadmnode import kubectl as _kubectl
from tools.kubeadm.images import REPOSITORY, SKIPPED_PHASES

NODE2, ADDRESS2 = "kadm2", "10.254.0.11"  # tests/kubeadm/joinnode.py, joined


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "spread", "namespace": "default"},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "spread"}},
        "template": {
            "metadata": {"labels": {"app": "spread"}},
            "spec": {
                "tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
                ],
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "spread"}},
                    }
                ],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.klet.test/busybox:1.36",
                        "command": ["sh", "-c", "sleep 3600"],
                    }
                ],
            },
        },
    },
}


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "main",
                "image": "registry.klet.test/busybox:1.36",
                "command": ["sh", "-c", "sleep 3600"],
            }
        ],
    },
}


def _sa_exists(kubectl: Path) -> bool:
    try:
        _kubectl(kubectl, "get", "serviceaccount", "default", "-o", "name")
    except AssertionError:
        return False
    return True


def _iptables_save() -> str:
    """The namespace's IPv4 rules, every table (the host's iptables: nf_tables, as
    kube-proxy's image runs it)."""
    return subprocess.run(
        ["iptables-save"], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _pods(kubectl: Path, *selector: str) -> list[dict[str, Any]]:
    listed = json.loads(_kubectl(kubectl, "get", "pods", *selector, "-o", "json"))
    return list(listed["items"])


def _addons_serve(kubectl: Path) -> list[str]:
    """kube-proxy's pod runs on the node and its rules carry the kubernetes Service; the
    pod `web` reaches 10.96.0.1:443 (the apiserver answers plain HTTP on its TLS port
    with its 400) and resolves kubernetes.default.svc.cluster.local to it through
    CoreDNS, both of whose replicas are ready here. The addon pods' UIDs."""
    system = ("-n", "kube-system")

    def proxy_running() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, *system, "-l", "k8s-app=kube-proxy")
        ok = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        return ok or None

    proxies = wait_for(proxy_running, timeout_s=180, what="the kube-proxy pod Running")
    assert [p["spec"]["nodeName"] for p in proxies] == [NODE]
    assert proxies[0]["spec"]["hostNetwork"] is True
    try:
        wait_for(
            lambda: "default/kubernetes:https" in _iptables_save(),
            timeout_s=60,
            what="kube-proxy's rules for the kubernetes Service",
        )
    except AssertionError as err:
        name = proxies[0]["metadata"]["name"]
        logs = _kubectl(kubectl, *system, "logs", name)
        raise AssertionError(f"{err}\n--- {name}:\n{logs[-4000:]}\n{_iptables_save()}") from err

    def dns_ready() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, *system, "-l", "k8s-app=kube-dns")
        ready = [
            p
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions") or []
            )
        ]
        return ready if len(ready) == 2 else None

    dns = wait_for(dns_ready, timeout_s=240, what="CoreDNS's two replicas Ready")
    apiserver = _kubectl(
        kubectl, "exec", "web", "--", "sh", "-c",
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 10.96.0.1 443",
    )  # fmt: skip
    assert "Client sent an HTTP request to an HTTPS server" in apiserver, apiserver
    resolv = _kubectl(kubectl, "exec", "web", "--", "cat", "/etc/resolv.conf")
    assert "nameserver 10.96.0.10" in resolv, resolv
    answer = _kubectl(
        kubectl, "exec", "web", "--", "nslookup", "kubernetes.default.svc.cluster.local"
    )
    answered = answer.split("kubernetes.default.svc.cluster.local", 1)[-1]
    assert "Address: 10.96.0.1" in answered, answer
    return [p["metadata"]["uid"] for p in [*proxies, *dns]]


@pytest.mark.timeout(900)
def test_kubeadm_init_with_klet_as_the_kubelet(node_host: Path, stack: DevStack) -> None:
    work = node_host / "work"
    work.mkdir()
    env = kubeadm_env()
    uids: list[str] = []  # the apiserver's pods run here, for the clean-up
    up: Initialized | None = None
    try:
        up = init(stack, work, skip_phases=SKIPPED_PHASES, addons=True)
        kubeadm, kubectl, plan, kubelet = up.kubeadm, up.kubectl, up.plan, up.kubelet
        # the store seeded from init's kubelet.conf, which kubelet-finalize then points
        # at it (it rewrites kubelet.conf only when the file is there)
        store = Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
        assert store.exists(), (work / "kubelet.log").read_text()[-3000:]
        assert str(store) in Path("/etc/kubernetes/kubelet.conf").read_text()

        node = json.loads(_kubectl(kubectl, "get", "node", NODE, "-o", "json"))
        assert "node-role.kubernetes.io/control-plane" in node["metadata"]["labels"]
        wanted = {
            f"{c}-{NODE}"
            for c in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        }

        def mirrors_running() -> set[str] | None:
            pods = json.loads(_kubectl(kubectl, "get", "pods", "-n", "kube-system", "-o", "json"))
            running = {
                p["metadata"]["name"]
                for p in pods["items"]
                if p.get("status", {}).get("phase") == "Running"
            }
            return running if wanted <= running else None

        wait_for(mirrors_running, timeout_s=120, what=f"the mirror pods {sorted(wanted)} Running")

        # the controller-manager makes the namespace's ServiceAccount shortly after it
        # starts; the apiserver's admission refuses a pod before that
        wait_for(
            lambda: _sa_exists(kubectl),
            timeout_s=60,
            what="the default ServiceAccount",
        )
        _kubectl(kubectl, "apply", "-f", "-", stdin=json.dumps(POD))

        def running() -> dict[str, Any] | None:
            pod: dict[str, Any] = json.loads(_kubectl(kubectl, "get", "pod", "web", "-o", "json"))
            return pod if pod.get("status", {}).get("phase") == "Running" else None

        pod = wait_for(running, timeout_s=180, what="the scheduled pod running")
        uids.append(pod["metadata"]["uid"])
        assert pod["spec"]["nodeName"] == NODE

        # kubeadm's addons: kube-proxy programs the kubernetes Service, CoreDNS answers
        # for it, from the pod (klet's clusterDNS is kubeadm's 10.96.0.10)
        uids.extend(_addons_serve(kubectl))

        # a second node joins with the printed command and a Deployment spreads over both
        join_cmd = subprocess.run(
            [str(kubeadm), "token", "create", "--print-join-command",
             "--kubeconfig", "/etc/kubernetes/admin.conf"],
            capture_output=True, text=True, check=True, env=env,
        ).stdout  # fmt: skip
        (work / "join.txt").write_text(join_cmd)
        node2 = subprocess.Popen(
            ["unshare", "--mount", "--net", "--propagation", "private", sys.executable,
             "-m", "tests.kubeadm.joinnode", str(kubeadm), str(work / "join.txt"),
             f"{TEST_REGISTRY_HOST}/{REPOSITORY}/pause:{plan.pause_tag}", NODE2, ADDRESS2,
             str(plan.binaries["kube-proxy"][0]), plan.binaries["kube-proxy"][1], str(CACHE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        try:
            run("ip", "link", "set", "kadm1", "netns", str(node2.pid))
            assert node2.stdout is not None
            first = node2.stdout.readline()
            assert first.startswith("JOINED 0"), first + node2.stdout.read(8000)

            def ready(name: str) -> bool:
                # join returns once the kubelet bootstrapped: the Node may not be there yet
                try:
                    node = json.loads(_kubectl(kubectl, "get", "node", name, "-o", "json"))
                except AssertionError:
                    return False
                conditions = node.get("status", {}).get("conditions") or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

            wait_for(lambda: ready(NODE2), timeout_s=180, what=f"{NODE2} Ready")
            _kubectl(kubectl, "apply", "-f", "-", stdin=json.dumps(DEPLOYMENT))

            def spread() -> dict[str, str] | None:
                pods = json.loads(
                    _kubectl(kubectl, "get", "pods", "-l", "app=spread", "-o", "json")
                )
                running = {
                    p["metadata"]["uid"]: p["spec"].get("nodeName", "")
                    for p in pods["items"]
                    if p.get("status", {}).get("phase") == "Running"
                }
                return running if sorted(running.values()) == [NODE, NODE2] else None

            on = wait_for(spread, timeout_s=180, what="the Deployment's pods on both nodes")
            uids.extend(u for u, n in on.items() if n == NODE)

            def proxies_on_both() -> list[str] | None:
                pods = _pods(kubectl, "-n", "kube-system", "-l", "k8s-app=kube-proxy")
                nodes = sorted(
                    p["spec"].get("nodeName", "")
                    for p in pods
                    if p.get("status", {}).get("phase") == "Running"
                )
                return nodes if nodes == [NODE, NODE2] else None

            wait_for(proxies_on_both, timeout_s=120, what="kube-proxy's pods on both nodes")
        finally:
            if node2.stdin is not None:
                node2.stdin.close()
            node2.wait(timeout=200)
            if node2.stdout is not None:
                node2.stdout.close()

        # kubeadm reset asks systemd to stop the kubelet (here it warns and goes on, as
        # upstream tells the operator to stop it by hand): stopped first, as systemd would
        stop(kubelet)
        reset_leaves_nothing(kubeadm, stack.runtime_endpoint, cleanup_tmp_dir=False)
        # kubeadm reset leaves kube-proxy's rules, as upstream says: its --cleanup removes them
        assert "KUBE-SERVICES" in _iptables_save()
        cleanup = subprocess.run(
            [str(plan.binaries["kube-proxy"][0]), "--cleanup"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert cleanup.returncode == 0, cleanup.stderr
        # what --cleanup keeps, as upstream's: KUBE-FIREWALL (filter), the chain kube-proxy
        # duplicates from the kubelet's (klet makes none), and its INPUT/OUTPUT jumps
        left_rules = [r for r in _iptables_save().splitlines() if "KUBE-" in r]
        assert all("KUBE-FIREWALL" in r for r in left_rules), left_rules
        for chain in ("INPUT", "OUTPUT"):
            run("iptables", "-t", "filter", "-D", chain, "-j", "KUBE-FIREWALL")
        run("iptables", "-t", "filter", "-F", "KUBE-FIREWALL")
        run("iptables", "-t", "filter", "-X", "KUBE-FIREWALL")
        assert "KUBE-" not in _iptables_save()
        ctr = ["ctr", "-a", stack.runtime_endpoint.removeprefix("unix://"), "-n", "k8s.io"]
        for what in ("containers", "tasks"):
            listed = subprocess.run(
                [*ctr, what, "ls", "-q"], capture_output=True, text=True, check=True
            ).stdout
            assert listed.strip() == "", f"{what} left after kubeadm reset: {listed}"
    finally:
        if up is not None:
            stop(up.kubelet)
        asyncio.run(remove_node_pods(stack.runtime_endpoint, NODE, uids=uids))
        for point in mounts_under(Path("/var/lib/kubelet")):
            subprocess.run(["umount", point], capture_output=True, check=False)

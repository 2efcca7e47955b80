"""DNS and hosts files seen from inside real containers on containerd.

A node started with `--cluster-dns 10.96.0.10 --cluster-domain cluster.local` and
`--resolv-conf` naming a file the test writes runs static pods; through CRI ExecSync:
`/etc/resolv.conf` for ClusterFirst (cluster server, `<ns>.svc.<domain> svc.<domain>
<domain>` plus the node file's search domains, ndots:5), Default (the node file), None
with dnsConfig (only the pod's, options merged), ClusterFirstWithHostNet on the host
network, and a dnsConfig over the nameserver limit (three kept, DNSConfigForming event);
`/etc/hosts` is the managed file with the pod IP from `/pods`, the hostname, the
subdomain FQDN and the hostAliases, and goes with the pod; `hostname` prints the pod's
hostname, or its FQDN with setHostnameAsFQDN; a container mounting its own /etc/hosts
keeps it; a host-network pod sees this node's own hosts entries plus its aliases and
the node's hostname; an FQDN over 64 characters leaves the pod ContainerCreating with
FailedCreatePodSandBox. A node without cluster DNS falls back to Default for
ClusterFirst pods with a MissingClusterDNS event.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tests.harness.node import KletNode, bus_events, container_status
from tests.harness.waiting import wait_for
from tests.integration.test_security import exec_in, start

NODE_RESOLV = (
    "# the node's resolver\nnameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n"
)
ALIASES = """
  hostAliases:
    - ip: 10.1.2.3
      hostnames: [foo.local, bar.local]
    - ip: 10.1.2.4
      hostnames: [baz.remote]
"""
ALIAS_SECTION = (
    "\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz.remote\n"
)
LOCALHOST = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)


def manifest(name: str, spec: str, *, namespace: str = "default") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
{spec}"""


CLUSTER_FIRST = manifest(
    "dnscf",
    "  hostname: web\n  subdomain: db\n" + ALIASES,
    namespace="team-a",
)
FQDN = manifest("dnsfqdn", "  hostname: web\n  subdomain: db\n  setHostnameAsFQDN: true\n")
DEFAULT = manifest("dnsdefault", "  dnsPolicy: Default\n")
NONE = manifest(
    "dnsnone",
    """  dnsPolicy: None
  dnsConfig:
    nameservers: [1.2.3.4]
    searches: [my.dns.search.suffix]
    options:
      - {name: ndots, value: "2"}
      - {name: edns0}
""",
)
TOO_MANY = manifest(
    "dnsmany",
    """  dnsPolicy: Default
  dnsConfig:
    nameservers: [1.1.1.1, 2.2.2.2, 3.3.3.3]
""",
)
HOST_NET = manifest(
    "dnshostnet", "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n" + ALIASES
)
LONG_FQDN = manifest(
    "dnslong", f"  hostname: {'h' * 40}\n  subdomain: db\n  setHostnameAsFQDN: true\n"
)


def own_hosts_manifest(path: Path) -> str:
    """A pod whose container mounts a file of its own at /etc/hosts."""
    return manifest(
        "dnsownhosts",
        f"""      volumeMounts:
        - {{name: hosts, mountPath: /etc/hosts}}
  volumes:
    - name: hosts
      hostPath: {{path: {path}, type: File}}
""",
    )


def resolv(node: KletNode, pod: dict[str, Any]) -> list[str]:
    return exec_in(node, pod, "main", "cat", "/etc/resolv.conf").splitlines()


def test_resolv_conf_hosts_and_hostname(node_factory: Any, manifests: Path, tmp_path: Path) -> None:
    node_resolv = tmp_path / "node-resolv.conf"
    node_resolv.write_text(NODE_RESOLV)
    node: KletNode = node_factory(
        manifest_dir=manifests,
        extra_flags=[
            "--cluster-dns",
            "10.96.0.10",
            "--cluster-domain",
            "cluster.local",
            "--resolv-conf",
            str(node_resolv),
        ],
    )
    node.start()
    for name, text in [
        ("dnscf", CLUSTER_FIRST),
        ("dnsfqdn", FQDN),
        ("dnsdefault", DEFAULT),
        ("dnsnone", NONE),
        ("dnsmany", TOO_MANY),
        ("dnshostnet", HOST_NET),
        ("dnslong", LONG_FQDN),
    ]:
        (manifests / f"{name}.yaml").write_text(text)
    cf = start(node, manifests, "dnscf", CLUSTER_FIRST)

    # ClusterFirst: the cluster server, the cluster search path before the node's, ndots:5
    assert resolv(node, cf) == [
        "search team-a.svc.cluster.local svc.cluster.local cluster.local corp.example",
        "nameserver 10.96.0.10",
        "options ndots:5",
    ]
    pod_ip = cf["status"]["podIP"]
    assert pod_ip
    assert exec_in(node, cf, "main", "cat", "/etc/hosts") == (
        "# Kubernetes-managed hosts file.\n"
        + LOCALHOST
        + f"{pod_ip}\tweb.db.team-a.svc.cluster.local\tweb\n"
        + ALIAS_SECTION
    )
    assert exec_in(node, cf, "main", "hostname").strip() == "web"

    fqdn = start(node, manifests, "dnsfqdn", FQDN)
    assert exec_in(node, fqdn, "main", "hostname").strip() == "web.db.default.svc.cluster.local"
    hosts = exec_in(node, fqdn, "main", "cat", "/etc/hosts")
    assert f"{fqdn['status']['podIP']}\tweb.db.default.svc.cluster.local\tweb\n" in hosts

    # Default: the node's resolver file as it is
    default = start(node, manifests, "dnsdefault", DEFAULT)
    assert resolv(node, default) == [
        "search corp.example",
        "nameserver 192.0.2.53",
        "options timeout:2",
    ]
    # no hostname in the spec: the pod's name
    assert exec_in(node, default, "main", "hostname").strip() == f"dnsdefault-{node.node_name}"

    # None: only the pod's dnsConfig
    none = start(node, manifests, "dnsnone", NONE)
    assert resolv(node, none) == [
        "search my.dns.search.suffix",
        "nameserver 1.2.3.4",
        "options ndots:2 edns0",
    ]

    # four nameservers in all: the first three are applied, with upstream's warning
    many = start(node, manifests, "dnsmany", TOO_MANY)
    assert [line for line in resolv(node, many) if line.startswith("nameserver")] == [
        "nameserver 192.0.2.53",
        "nameserver 1.1.1.1",
        "nameserver 2.2.2.2",
    ]
    forming = wait_for(
        lambda: [e for e in bus_events(node, "dnsmany") if e.reason == "DNSConfigForming"],
        timeout_s=20,
        what="DNSConfigForming event",
    )
    assert forming[0].type == "Warning"
    assert forming[0].message == (
        "Nameserver limits were exceeded, some nameservers have been omitted, "
        "the applied nameserver line is: 192.0.2.53 1.1.1.1 2.2.2.2"
    )

    # the host network: cluster DNS (ClusterFirstWithHostNet), the node's hosts and hostname
    host_net = start(node, manifests, "dnshostnet", HOST_NET)
    assert resolv(node, host_net)[1] == "nameserver 10.96.0.10"
    assert exec_in(node, host_net, "main", "cat", "/etc/hosts") == (
        "# Kubernetes-managed hosts file (host network).\n"
        + Path("/etc/hosts").read_text()
        + ALIAS_SECTION
    )
    assert exec_in(node, host_net, "main", "hostname").strip() == socket.gethostname()

    # an FQDN too long for the kernel: no sandbox, the reason in an event
    def long_waiting() -> dict[str, Any] | None:
        pod = node.pods().get(f"dnslong-{node.node_name}")
        if not pod or not pod["status"].get("containerStatuses"):
            return None
        waiting = container_status(pod, "main")["state"].get("waiting", {})
        return pod if waiting.get("reason") == "ContainerCreating" else None

    wait_for(long_waiting, timeout_s=30, what="dnslong ContainerCreating")
    failed = wait_for(
        lambda: [e for e in bus_events(node, "dnslong") if e.reason == "FailedCreatePodSandBox"],
        timeout_s=30,
        what="FailedCreatePodSandBox event",
    )
    fqdn_text = "h" * 40 + ".db.default.svc.cluster.local"
    assert failed[0].message == (
        "Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster "
        f"domain, FQDN {fqdn_text} is too long (64 characters is the max, "
        f"{len(fqdn_text)} characters requested)"
    )

    # a container that mounts its own /etc/hosts keeps it
    own_file = tmp_path / "own-hosts"
    own_file.write_text("10.9.9.9\town.example\n")
    own = start(node, manifests, "dnsownhosts", own_hosts_manifest(own_file))
    assert exec_in(node, own, "main", "cat", "/etc/hosts") == "10.9.9.9\town.example\n"

    # the hosts file lives in the pod directory and goes with the pod
    uid = cf["metadata"]["uid"]
    hosts_file = node.root_dir / "pods" / uid / "etc-hosts"
    assert hosts_file.is_file()
    (manifests / "dnscf.yaml").unlink()
    wait_for(
        lambda: f"dnscf-{node.node_name}" not in node.pods() and not hosts_file.exists(),
        timeout_s=60,
        what="dnscf removed with its hosts file",
    )


def test_cluster_first_without_cluster_dns_falls_back(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    node_resolv = tmp_path / "node-resolv.conf"
    node_resolv.write_text(NODE_RESOLV)
    node: KletNode = node_factory(
        manifest_dir=manifests, extra_flags=["--resolv-conf", str(node_resolv)]
    )
    node.start()
    pod = start(node, manifests, "dnsfallback", manifest("dnsfallback", ""))
    assert resolv(node, pod) == [
        "search corp.example",
        "nameserver 192.0.2.53",
        "options timeout:2",
    ]
    missing = wait_for(
        lambda: [e for e in bus_events(node, "dnsfallback") if e.reason == "MissingClusterDNS"],
        timeout_s=20,
        what="MissingClusterDNS event",
    )
    full = f"dnsfallback-{node.node_name}"
    assert missing[0].message == (
        f'pod: "{full}_default({pod["metadata"]["uid"]})". kubelet does not have ClusterDNS IP '
        'configured and cannot create Pod using "ClusterFirst" policy. Falling back to '
        '"Default" policy.'
    )

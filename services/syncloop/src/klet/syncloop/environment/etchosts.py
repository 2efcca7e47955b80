"""The kubelet-managed /etc/hosts of a pod's containers.

As upstream: once the pod has an IP (the sandbox exists; a host-network pod has the
node's addresses), every container that does not mount something at /etc/hosts itself
gets `<root-dir>/pods/<uid>/etc-hosts` mounted there, read-write. For a pod on the pod
network the file is generated: a `# Kubernetes-managed hosts file.` header, the
localhost and IPv6 entries, one line per pod IP with the hostname (preceded by the FQDN
`<hostname>.<subdomain>.<ns>.svc.<clusterDomain>` when the pod has a subdomain), then
the `hostAliases` under `# Entries added by HostAliases.`. A host-network pod gets a
copy of the node's hosts file under a `(host network)` header, with its hostAliases
appended.

The file is written once per sandbox: by the first container started in a new sandbox
(its IP is known by then), with the sandbox's ID recorded beside it. Later containers
of the same sandbox, and restarts, mount the file as it is, so a running container never
sees its /etc/hosts truncated and rewritten under it (and keeps entries it added
itself). A new sandbox (a new IP) gets a new file, written aside and renamed into place;
by then the old sandbox's containers are stopped. Upstream rewrites the file before
every container start; the once-per-sandbox rule is klet's (issue 11).

The content functions are pure; `hosts_mount` is the small I/O shell that writes the
file, and reports failures as `HostsFileError` (the container then waits in
CreateContainerConfigError and is retried, as upstream).
"""

from __future__ import annotations

import os
from pathlib import Path

from klet.cri.types import Mount
from klet.model.layout import pod_dir
from klet.model.podvalidation import UnsafePathComponent, checked_component
from klet.model.types import JSON
from klet.syncloop.environment import dns

ETC_HOSTS = "/etc/hosts"
FILE_NAME = "etc-hosts"
SANDBOX_FILE_NAME = "etc-hosts.sandbox"
"""Beside the hosts file: the ID of the sandbox it was written for."""
FILE_MODE = 0o644
MANAGED_HEADER = "# Kubernetes-managed hosts file.\n"
HOST_NETWORK_HEADER = "# Kubernetes-managed hosts file (host network).\n"
_LOCALHOST_ENTRIES = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)


class HostsFileError(Exception):
    """The pod's hosts file cannot be made."""


def managed_content(
    pod_ips: tuple[str, ...], *, hostname: str, domain: str, host_aliases: list[JSON]
) -> str:
    """The generated hosts file of a pod on the pod network."""
    names = f"{hostname}.{domain}\t{hostname}" if domain else hostname
    own = "".join(f"{ip}\t{names}\n" for ip in pod_ips)
    return MANAGED_HEADER + _LOCALHOST_ENTRIES + own + alias_entries(host_aliases)


def host_network_content(node_hosts: str, *, host_aliases: list[JSON]) -> str:
    """The hosts file of a host-network pod: the node's own, then the pod's aliases."""
    return HOST_NETWORK_HEADER + node_hosts + alias_entries(host_aliases)


def alias_entries(host_aliases: list[JSON]) -> str:
    """The hostAliases section: one line per IP with all of its names ("" for none)."""
    if not host_aliases:
        return ""
    lines = "".join(
        f"{a.get('ip', '')}\t{chr(9).join(str(h) for h in a.get('hostnames') or ())}\n"
        for a in host_aliases
    )
    return "\n# Entries added by HostAliases.\n" + lines


def wants_hosts_file(container: JSON, pod_ips: tuple[str, ...]) -> bool:
    """Whether the container gets the managed file: the pod has an IP and the container
    does not mount anything at /etc/hosts itself."""
    if not pod_ips:
        return False
    return all(m.get("mountPath") != ETC_HOSTS for m in container.get("volumeMounts") or ())


def hosts_path(root_dir: Path, uid: str) -> Path:
    return pod_dir(root_dir, checked_component(uid, what="pod UID")) / FILE_NAME


def needs_writing(*, written_for: str | None, sandbox_id: str, exists: bool) -> bool:
    """Whether the hosts file must be (re)written: it is missing, or was written for
    another sandbox (or none recorded). Never for a sandbox it was already written for."""
    return not exists or written_for != sandbox_id


def _read_marker(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _write_replacing(path: Path, content: str, mode: int) -> None:
    """Write `content` aside and rename it over `path`: a new file, never one truncated
    and refilled in place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.chmod(tmp, mode)  # the creation mode is subject to the umask
    os.replace(tmp, path)


def reported_pod_ips(pod: JSON, *, pod_ip: str, node_ips: tuple[str, ...]) -> tuple[str, ...]:
    """The pod's IPs as its status reports them, for its hosts file and the downward
    API alike: the sandbox's IP, or the node's addresses for a host-network pod."""
    if (pod.get("spec") or {}).get("hostNetwork"):
        return node_ips
    return (pod_ip,) if pod_ip else ()


def hosts_mount(
    root_dir: Path,
    pod: JSON,
    container: JSON,
    *,
    sandbox_id: str,
    pod_ip: str,
    node_ips: tuple[str, ...],
    cluster_domain: str,
    node_hosts_file: str = ETC_HOSTS,
) -> tuple[Mount, ...]:
    """The mount of the pod's hosts file, or nothing when none is wanted; the file is
    written only when the sandbox `sandbox_id` has none yet."""
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    pod_ips = reported_pod_ips(pod, pod_ip=pod_ip, node_ips=node_ips)
    if not uid or not wants_hosts_file(container, pod_ips):
        return ()
    spec = pod.get("spec") or {}
    aliases = list(spec.get("hostAliases") or ())
    path = hosts_path(root_dir, uid)
    marker = path.with_name(SANDBOX_FILE_NAME)
    try:
        if not needs_writing(
            written_for=_read_marker(marker), sandbox_id=sandbox_id, exists=path.is_file()
        ):
            return (Mount(container_path=ETC_HOSTS, host_path=str(path)),)
        if spec.get("hostNetwork"):
            node_hosts = Path(node_hosts_file).read_text(errors="replace")
            content = host_network_content(node_hosts, host_aliases=aliases)
        else:
            hostname, domain = dns.hostname_and_domain(pod, cluster_domain=cluster_domain)
            content = managed_content(
                pod_ips, hostname=hostname, domain=domain, host_aliases=aliases
            )
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        _write_replacing(path, content, FILE_MODE)
        _write_replacing(marker, sandbox_id + "\n", 0o600)  # after the file it vouches for
    except dns.PodDNSError as err:
        raise HostsFileError(str(err)) from err
    except OSError as err:
        raise HostsFileError(dns.os_error_text(err, path)) from err
    return (Mount(container_path=ETC_HOSTS, host_path=str(path)),)


def remove_hosts_file(root_dir: Path, uid: str) -> None:
    """Remove the pod's hosts file once the pod is gone (absent is fine)."""
    if uid:
        try:
            path = hosts_path(root_dir, uid)
        except UnsafePathComponent:
            return  # a UID read from the runtime's labels that no pod directory can have
        path.unlink(missing_ok=True)
        path.with_name(SANDBOX_FILE_NAME).unlink(missing_ok=True)

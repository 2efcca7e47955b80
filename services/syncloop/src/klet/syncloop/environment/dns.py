"""Pod DNS: the resolver configuration of a sandbox, and the pod's hostname and domain.

As upstream's DNS configurer: `dnsPolicy` picks the base — ClusterFirst (the default)
uses the cluster DNS servers with the search path `<ns>.svc.<domain> svc.<domain>
<domain>` followed by the node's own search domains and `ndots:5`; a host-network pod
with ClusterFirst, and Default, use the node's resolver file (`resolvConf`; an empty
path means a resolver on the local machine, `127.0.0.1`/`::1` with search `.`);
ClusterFirstWithHostNet uses the cluster DNS even on the host network; None starts
empty. Without cluster DNS servers, ClusterFirst falls back to Default with a
`MissingClusterDNS` warning. The pod's `dnsConfig` is appended (servers and searches
without duplicates, options merged by name, the pod's value winning), and the result is
cut to upstream's limits (3 nameservers; 32 search domains, none longer than 253
characters, 2048 characters in all) with a `DNSConfigForming` warning naming what is
applied.

The hostname rules are upstream's too: `spec.hostname` (a DNS label) or the pod name,
cut to 63 characters without a trailing `-` or `.`; `spec.subdomain` makes the domain
`<subdomain>.<ns>.svc.<clusterDomain>`; `setHostnameAsFQDN` makes the kernel hostname
the FQDN, which must fit in 64 characters.

Everything here is pure except `load_host_config`, the one small read of the node's
resolver file; the caller turns the warnings into pod events.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from klet.cri.types import DNSConfig
from klet.model.types import JSON

MAX_NAMESERVERS = 3
MAX_SEARCH_PATHS = 32
MAX_SEARCH_LIST_CHARS = 2048
MAX_SEARCH_PATH_CHARS = 253  # a search path longer than a DNS-1123 subdomain crashes glibc
MAX_RESOLV_CONF_BYTES = 10 * 1024 * 1024
HOSTNAME_MAX_CHARS = 63
FQDN_MAX_CHARS = 64  # the kernel's nodename field
DEFAULT_OPTIONS = ("ndots:5",)

CLUSTER_FIRST = "ClusterFirst"
CLUSTER_FIRST_WITH_HOST_NET = "ClusterFirstWithHostNet"
DEFAULT = "Default"
NONE = "None"

_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class PodDNSError(Exception):
    """The pod's DNS configuration or hostname cannot be formed; its sandbox is not made."""


@dataclass(frozen=True)
class DNSSettings:
    """The node's DNS settings (KubeletConfiguration clusterDNS, clusterDomain, resolvConf)."""

    cluster_dns: tuple[str, ...] = ()
    """--cluster-dns: the cluster DNS server IPs; empty makes ClusterFirst fall back."""
    cluster_domain: str = ""
    """--cluster-domain, e.g. cluster.local; empty adds no cluster search domains."""
    resolv_conf: str = "/etc/resolv.conf"
    """--resolv-conf: the node's resolver file; "" means a resolver on the local machine."""


@dataclass(frozen=True)
class ResolvConf:
    """What a resolv.conf says: nameservers accumulate, the last search/options line wins."""

    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodDNS:
    config: DNSConfig
    warnings: tuple[tuple[str, str], ...] = ()
    """(reason, message) of each Warning event to record on the pod."""


def os_error_text(err: OSError, path: str | Path) -> str:
    """An OS error worded as Go's os package does: `open /etc/x: no such file or directory`."""
    reason = err.strerror or str(err)
    return f"open {err.filename or path}: {reason[:1].lower()}{reason[1:]}"


def parse_resolv_conf(text: str) -> ResolvConf:
    """Parse resolv.conf text; raises `PodDNSError` for a `nameserver` line without a value."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    errors: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        words = stripped.split()
        if not words:
            continue
        if words[0] == "nameserver":
            if len(words) >= 2:
                servers.append(words[1])
            else:
                errors.append("nameserver list is empty ")
        elif words[0] == "search":
            # one domain with and without its trailing dot counts once
            searches = [s.removesuffix(".") for s in words[1:]]
        elif words[0] == "options":
            options = words[1:]
    if errors:
        raise PodDNSError(errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")
    return ResolvConf(tuple(servers), tuple(searches), tuple(options))


def load_host_config(path: str) -> ResolvConf:
    """The node's resolver file (nothing for ""); raises `PodDNSError` when unreadable."""
    if not path:
        return ResolvConf()
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_RESOLV_CONF_BYTES + 1)
    except OSError as err:
        raise PodDNSError(os_error_text(err, path)) from err
    if len(data) > MAX_RESOLV_CONF_BYTES:
        raise PodDNSError("the read limit is reached")
    return parse_resolv_conf(data.decode(errors="replace"))


def pod_dns(
    pod: JSON, *, settings: DNSSettings, host: ResolvConf, node_ips: tuple[str, ...] = ()
) -> PodDNS:
    """The sandbox's DNSConfig for `pod`, given the node's parsed resolver file `host`."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    warnings: list[tuple[str, str]] = []
    servers, searches, options = list(host.servers), list(host.searches), list(host.options)
    kind = _dns_kind(spec)
    if kind == NONE:
        servers, searches, options = [], [], []
    elif kind == CLUSTER_FIRST and settings.cluster_dns:
        servers = list(settings.cluster_dns)
        searches = cluster_searches(host.searches, namespace, settings.cluster_domain)
        options = list(DEFAULT_OPTIONS)
    else:
        if kind == CLUSTER_FIRST:
            warnings.append(("MissingClusterDNS", missing_cluster_dns_message(pod)))
        if not settings.resolv_conf:
            servers = [_loopback(ip) for ip in node_ips] or ["127.0.0.1"]
            searches = ["."]
    extra = spec.get("dnsConfig")
    if extra:
        servers = _unique([*servers, *(str(s) for s in extra.get("nameservers") or ())])
        searches = _unique([*searches, *(str(s) for s in extra.get("searches") or ())])
        options = merge_options(options, extra.get("options") or ())
    servers, server_warning = fit_nameservers(servers)
    searches, search_warning = fit_searches(searches)
    warnings += [("DNSConfigForming", w) for w in (server_warning, search_warning) if w]
    return PodDNS(DNSConfig(tuple(servers), tuple(searches), tuple(options)), tuple(warnings))


def _dns_kind(spec: JSON) -> str:
    """CLUSTER_FIRST, DEFAULT or NONE: which base the pod's policy uses."""
    policy = spec.get("dnsPolicy") or CLUSTER_FIRST
    if policy == NONE:
        return NONE
    if policy == DEFAULT or (policy == CLUSTER_FIRST and spec.get("hostNetwork")):
        return DEFAULT
    # ClusterFirstWithHostNet, ClusterFirst, and (as upstream) an unknown policy
    return CLUSTER_FIRST


def _loopback(node_ip: str) -> str:
    try:
        return "::1" if ipaddress.ip_address(node_ip).version == 6 else "127.0.0.1"
    except ValueError:
        return "127.0.0.1"


def missing_cluster_dns_message(pod: JSON) -> str:
    meta = pod.get("metadata") or {}
    desc = f"{meta.get('name', '')}_{meta.get('namespace', 'default')}({meta.get('uid', '')})"
    return (
        f'pod: "{desc}". kubelet does not have ClusterDNS IP configured and cannot create Pod '
        f'using "{CLUSTER_FIRST}" policy. Falling back to "{DEFAULT}" policy.'
    )


def cluster_searches(host_searches: tuple[str, ...], namespace: str, domain: str) -> list[str]:
    """The cluster search domains, then the node's, without duplicates."""
    if not domain:
        return list(host_searches)
    return _unique([f"{namespace}.svc.{domain}", f"svc.{domain}", domain, *host_searches])


def merge_options(existing: list[str], pod_options: list[JSON] | tuple[JSON, ...]) -> list[str]:
    """Options by name, in first-seen order; a pod option replaces one of the same name."""
    merged: dict[str, str] = {}
    for op in existing:
        name, _, value = op.partition(":")
        merged[name] = value
    for pod_op in pod_options:
        merged[str(pod_op.get("name", ""))] = str(pod_op.get("value") or "")
    return [f"{name}:{value}" if value else name for name, value in merged.items()]


def fit_nameservers(servers: list[str]) -> tuple[list[str], str]:
    """At most 3 nameservers; the warning message ("" when nothing was dropped)."""
    if len(servers) <= MAX_NAMESERVERS:
        return servers, ""
    kept = servers[:MAX_NAMESERVERS]
    return kept, (
        "Nameserver limits were exceeded, some nameservers have been omitted, "
        f"the applied nameserver line is: {' '.join(kept)}"
    )


def fit_searches(searches: list[str]) -> tuple[list[str], str]:
    """The search path within upstream's limits; the warning message ("" when it fitted)."""
    exceeded = len(searches) > MAX_SEARCH_PATHS
    kept = [s for s in searches[:MAX_SEARCH_PATHS] if len(s) <= MAX_SEARCH_PATH_CHARS]
    exceeded = exceeded or len(kept) < min(len(searches), MAX_SEARCH_PATHS)
    length = len(" ".join(kept))
    if length > MAX_SEARCH_LIST_CHARS:
        exceeded = True
        # drop domains from the end until the line fits
        while kept and length > MAX_SEARCH_LIST_CHARS:
            length -= len(kept.pop()) + 1
    if not exceeded:
        return kept, ""
    return kept, (
        "Search Line limits were exceeded, some search paths have been omitted, "
        f"the applied search line is: {' '.join(kept)}"
    )


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


# --- hostname and domain ----------------------------------------------------------------


def _label_problems(value: str) -> list[str]:
    """Upstream's IsDNS1123Label messages; empty when `value` is a valid label."""
    problems = []
    if len(value) > HOSTNAME_MAX_CHARS:
        problems.append(f"must be no more than {HOSTNAME_MAX_CHARS} characters")
    if not _LABEL_RE.fullmatch(value):
        if _SUBDOMAIN_RE.fullmatch(value):
            problems.append("must not contain dots")
        else:
            problems.append(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                "or '-', and must start and end with an alphanumeric character (e.g. 'my-name', "
                " or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            )
    return problems


def hostname_and_domain(pod: JSON, *, cluster_domain: str) -> tuple[str, str]:
    """The pod's short hostname and its domain ("" without a subdomain).

    Raises `PodDNSError` when `spec.hostname` or `spec.subdomain` is not a DNS label.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name = str(meta.get("name", ""))
    hostname = name
    if spec.get("hostname"):
        hostname = str(spec["hostname"])
        problems = _label_problems(hostname)
        if problems:
            raise PodDNSError(
                f"pod Hostname {_go_quote(hostname)} is not a valid DNS label: {';'.join(problems)}"
            )
    if len(hostname) > HOSTNAME_MAX_CHARS:
        truncated = hostname[:HOSTNAME_MAX_CHARS].rstrip("-.")
        if not truncated:
            raise PodDNSError(
                f"hostname for pod {_go_quote(name)} was invalid: {_go_quote(hostname)}"
            )
        hostname = truncated
    domain = ""
    if spec.get("subdomain"):
        subdomain = str(spec["subdomain"])
        problems = _label_problems(subdomain)
        if problems:
            raise PodDNSError(
                f"pod Subdomain {_go_quote(subdomain)} is not a valid DNS label: "
                f"{';'.join(problems)}"
            )
        namespace = meta.get("namespace") or "default"
        domain = f"{subdomain}.{namespace}.svc.{cluster_domain}"
    return hostname, domain


def kernel_hostname(pod: JSON, *, cluster_domain: str) -> str:
    """The hostname the pod's UTS namespace gets: the FQDN with `setHostnameAsFQDN`.

    Raises `PodDNSError` when the FQDN does not fit the kernel's 64 characters.
    """
    hostname, domain = hostname_and_domain(pod, cluster_domain=cluster_domain)
    if not (domain and (pod.get("spec") or {}).get("setHostnameAsFQDN")):
        return hostname
    fqdn = f"{hostname}.{domain}"
    if len(fqdn) > FQDN_MAX_CHARS:
        raise PodDNSError(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN "
            f"{fqdn} is too long ({FQDN_MAX_CHARS} characters is the max, "
            f"{len(fqdn)} characters requested)"
        )
    return fqdn


def _go_quote(value: str) -> str:
    """Go's %q for the plain strings a pod name or label holds."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

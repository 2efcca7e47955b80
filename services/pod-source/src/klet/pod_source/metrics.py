"""pod-source's Prometheus metrics, all in one place (STYLE.md rule 18).

Built on a registry passed in, so each test gets a fresh one and two services in one
process never collide. Label values come from closed sets: `source` is file/http/api,
`reason` is one of `manifests.REASONS` for manifest errors and one of
`API_ERROR_REASONS` for the apiserver source.

Upstream has no equivalents for these (the kubelet only logs bad manifests), so they
carry the `klet_` prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

# Why a list or watch of the apiserver source failed: the resourceVersion expired (410,
# a relist follows), the apiserver did not answer, it refused our identity, or anything
# else (a malformed answer, an unexpected status).
API_ERROR_REASONS = ("expired", "unavailable", "forbidden", "other")


@dataclass(frozen=True)
class Metrics:
    """The service's collectors; see `create_metrics`."""

    manifest_errors: Counter
    pods: Gauge
    snapshots: Counter
    bus_errors: Counter
    api_relists: Counter
    api_watch_errors: Counter
    api_watches: Counter
    file_scans: Counter


def create_metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(
        manifest_errors=Counter(
            "klet_pod_source_manifest_errors_total",
            "Manifests (files, URL bodies, pods) refused, counted once per distinct error.",
            ["source", "reason"],
            registry=registry,
        ),
        pods=Gauge(
            "klet_pod_source_pods",
            "Pods currently desired from each source.",
            ["source"],
            registry=registry,
        ),
        snapshots=Counter(
            "klet_pod_source_snapshots_total",
            "Full snapshots delivered by each source to the merge.",
            ["source"],
            registry=registry,
        ),
        bus_errors=Counter(
            "klet_pod_source_bus_errors_total",
            "Failed attempts to read or write the Redis bus.",
            registry=registry,
        ),
        api_relists=Counter(
            "klet_pod_source_api_relists_total",
            "Full lists of this node's pods after the first one (an expired watch, an outage).",
            registry=registry,
        ),
        api_watch_errors=Counter(
            "klet_pod_source_api_watch_errors_total",
            "Lists and watches of the apiserver source that ended in an error.",
            ["reason"],
            registry=registry,
        ),
        api_watches=Counter(
            "klet_pod_source_api_watches_total",
            "Watches of this node's pods that ended without an error (the server's timeout).",
            registry=registry,
        ),
        file_scans=Counter(
            "klet_pod_source_file_scans_total",
            "Scans of the manifest directory, whether or not they found a change.",
            registry=registry,
        ),
    )

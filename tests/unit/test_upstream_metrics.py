"""The generated list of upstream's kubelet metrics and klet's accounts of those it does
not serve (tools/upstream_metrics.json, tools/upstream_metrics_accounts.py).

That every metric not accounted for is on klet's pages is proven against a running node by
tests/cluster/test_kubelet_metrics.py::test_upstream_metric_names_served_or_accounted;
here the table itself is checked: each entry names a metric of the list, once.
"""

from __future__ import annotations

from collections import Counter

from tools.upstream_metrics import _full_name, _hidden
from tools.upstream_metrics_accounts import (
    CONFIGURED,
    ENDPOINTS,
    MISSING,
    NOT_APPLICABLE,
    account,
    upstream_metrics,
)


def test_the_list_is_upstreams_kubelet_at_the_projects_version() -> None:
    metrics = upstream_metrics()
    keys = [m.key for m in metrics]
    assert len(keys) == len(set(keys))
    assert {m.endpoint for m in metrics} == set(ENDPOINTS)
    assert {m.type for m in metrics} <= {"counter", "gauge", "histogram", "summary", "custom"}
    # the names issue 41 item 5 names, each on its page
    for key in (
        "/metrics kubelet_desired_pods",
        "/metrics kubelet_pleg_discard_events",
        "/metrics kubernetes_feature_enabled",
        "/metrics csi_operations_seconds",
        "/metrics/cadvisor container_memory_failures_total",
        "/metrics/cadvisor container_file_descriptors",
        "/metrics/probes prober_probe_total",
        "/metrics/resource node_cpu_usage_seconds_total",
        "/metrics/slis kubernetes_healthchecks_total",
    ):
        assert key in keys, key
    # a kube-apiserver metric the kubelet links but never registers is not listed
    assert "/metrics apiserver_request_total" not in keys
    desired = next(m for m in metrics if m.name == "kubelet_desired_pods")
    assert (desired.type, desired.labels) == ("gauge", ("static",))


def test_every_account_names_a_listed_metric_once() -> None:
    listed = {m.key for m in upstream_metrics()}
    entries = [
        key
        for table in (NOT_APPLICABLE, MISSING, CONFIGURED)
        for keys in table.values()
        for key in keys
    ]
    assert [key for key, n in Counter(entries).items() if n > 1] == []
    assert sorted(set(entries) - listed) == []
    for table in (NOT_APPLICABLE, MISSING, CONFIGURED):
        assert all(reason.strip() for reason in table)


def test_account_gives_the_reason_or_none() -> None:
    by_key = {m.key: m for m in upstream_metrics()}
    assert account(by_key["/metrics kubelet_running_pods"]) is None
    assert "Windows" in (
        account(by_key["/metrics kubelet_started_host_process_containers_total"]) or ""
    )
    # served under the configuration upstream serves it under, which the test node lacks
    assert "rotateCertificates" in (
        account(by_key["/metrics kubelet_certificate_manager_client_ttl_seconds"]) or ""
    )


def test_generator_names_and_hides_as_component_base() -> None:
    assert _full_name({"namespace": "kubernetes", "name": "feature_enabled"}) == (
        "kubernetes_feature_enabled"
    )
    assert _full_name({"subsystem": "kubelet", "name": "desired_pods"}) == "kubelet_desired_pods"
    assert _hidden("1.29.0") and _hidden("1.33.0")
    assert not _hidden("1.34.0") and not _hidden(None)

"""Merging the services' expositions (metricsmerge.py): counters and histograms of one
series summed across services, gauges kept from the first source, a family of another
TYPE dropped, other services' process families dropped, the prober families split off
for /metrics/probes, and the result a valid exposition with no `_created` series."""

from __future__ import annotations

import pytest
from klet.obs import leader_metric
from klet.status_reporter.metrics import metricsmerge
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric


def families(registry: CollectorRegistry) -> list[Metric]:
    return metricsmerge.parse(generate_latest(registry).decode())


def samples(fams: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


def runtime_ops(count: int, seconds: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    ops = Counter("kubelet_runtime_operations", "ops", ["operation_type"], registry=registry)
    hist = Histogram(
        "kubelet_runtime_operations_duration_seconds",
        "dur",
        ["operation_type"],
        buckets=(0.1, 1.0),
        registry=registry,
    )
    for _ in range(count):
        ops.labels("list_containers").inc()
        hist.labels("list_containers").observe(seconds)
    return registry


def test_counters_and_histograms_of_one_series_are_summed() -> None:
    merged = metricsmerge.merge([families(runtime_ops(2, 0.05)), families(runtime_ops(3, 0.5))])
    got = samples(merged.families)
    op = (("operation_type", "list_containers"),)
    assert got[("kubelet_runtime_operations_total", op)] == 5
    name = "kubelet_runtime_operations_duration_seconds"
    assert got[(name + "_count", op)] == 5
    assert got[(name + "_sum", op)] == pytest.approx(2 * 0.05 + 3 * 0.5)
    assert got[(name + "_bucket", (("le", "0.1"), *op))] == 2
    assert got[(name + "_bucket", (("le", "1.0"), *op))] == 5
    assert got[(name + "_bucket", (("le", "+Inf"), *op))] == 5
    assert merged.conflicts == []


def test_histograms_with_other_buckets_are_not_summed() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    Histogram("h_seconds", "h", buckets=(1.0,), registry=a).observe(0.5)
    Histogram("h_seconds", "h", buckets=(2.0,), registry=b).observe(0.5)
    got = samples(metricsmerge.merge([families(a), families(b)]).families)
    assert got[("h_seconds_count", ())] == 1
    assert ("h_seconds_bucket", (("le", "2.0"),)) not in got


def test_a_gauge_keeps_the_first_sources_value_and_distinct_labels_are_all_kept() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    Gauge("kubelet_running_pods", "from the runtime", registry=first).set(3)
    Gauge("kubelet_running_pods", "from the statuses", registry=second).set(2)
    leader_metric(first, service="syncloop", leading=lambda: True)
    leader_metric(second, service="eviction", leading=lambda: False)
    merged = metricsmerge.merge([families(first), families(second)])
    got = samples(merged.families)
    assert got[("kubelet_running_pods", ())] == 3
    assert got[("klet_leader", (("service", "syncloop"),))] == 1
    assert got[("klet_leader", (("service", "eviction"),))] == 0
    running = next(f for f in merged.families if f.name == "kubelet_running_pods")
    assert running.documentation == "from the runtime"


def test_a_family_of_another_type_is_dropped_and_reported() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    Gauge("x_things", "a gauge", registry=first).set(1)
    Histogram("x_things", "a histogram", registry=second).observe(1)
    merged = metricsmerge.merge([families(first), families(second)])
    assert merged.conflicts == ["x_things"]
    text = metricsmerge.render_families(merged.families).decode()
    assert text.count("# TYPE x_things ") == 1
    assert "x_things_bucket" not in text


def test_rendering_is_one_family_per_name_and_reparses() -> None:
    merged = metricsmerge.merge([families(runtime_ops(1, 0.2)), families(runtime_ops(1, 0.2))])
    text = metricsmerge.render_families(merged.families).decode()
    assert text.count("# TYPE kubelet_runtime_operations_total counter") == 1
    assert text.count("# HELP kubelet_runtime_operations_duration_seconds ") == 1
    assert "_created" not in text
    assert samples(metricsmerge.parse(text)) == samples(merged.families)


def test_leads_reads_the_replicas_own_leader_series() -> None:
    standby, leader = CollectorRegistry(), CollectorRegistry()
    leader_metric(standby, service="syncloop", leading=lambda: False)
    leader_metric(leader, service="syncloop", leading=lambda: True)
    assert metricsmerge.leads(families(leader), "syncloop") is True
    assert metricsmerge.leads(families(standby), "syncloop") is False
    assert metricsmerge.leads(families(leader), "eviction") is None


def test_process_families_and_probe_families() -> None:
    registry = CollectorRegistry()
    Gauge("process_resident_memory_bytes", "rss", registry=registry).set(1)
    Gauge("python_info", "py", registry=registry).set(1)
    Counter("prober_probe", "p", ["probe_type"], registry=registry).labels("Liveness").inc()
    Histogram("prober_probe_duration_seconds", "d", registry=registry).observe(0.1)
    Gauge("kubelet_running_pods", "pods", registry=registry).set(1)
    fams = families(registry)
    assert [f.name for f in metricsmerge.without_process_families(fams)] == [
        "prober_probe",
        "prober_probe_duration_seconds",
        "kubelet_running_pods",
    ]
    main, probes = metricsmerge.split_probes(fams)
    assert {f.name for f in probes} == {"prober_probe", "prober_probe_duration_seconds"}
    assert "kubelet_running_pods" in {f.name for f in main}


def test_garbage_is_not_an_exposition() -> None:
    with pytest.raises(ValueError, match="not a Prometheus text exposition"):
        metricsmerge.parse('metric{label="unterminated 1\n')

"""`/metrics/resource` rendered from a Summary (kubeletapi/resourcemetrics.py): the swap
series upstream's resource collector serves, node_swap_usage_bytes, pod_swap_usage_bytes,
container_swap_usage_bytes and container_swap_limit_bytes (the container's available
swap plus its usage; none without a limit), with their labels, [ALPHA] help texts and
gauge types; a summary without swap gives no swap samples, only the families."""

from __future__ import annotations

from klet.model.types import JSON
from klet.status_reporter.kubeletapi.resourcemetrics import resource_metrics
from prometheus_client.parser import text_string_to_metric_families

NOW_MS = 1_700_000_000_000
SWAP = "swap"


def summary(*, swap: bool) -> JSON:
    def s(usage: int, available: int | None = None) -> JSON:
        out: JSON = {"time": "2023-11-14T22:13:20Z", "swapUsageBytes": usage}
        if available is not None:
            out["swapAvailableBytes"] = available
        return out

    app: JSON = {"name": "app", "startTime": "2023-11-14T22:13:20Z"}
    side: JSON = {"name": "side", "startTime": "2023-11-14T22:13:20Z"}
    node: JSON = {"memory": {"workingSetBytes": 3000}}
    pod: JSON = {"podRef": {"name": "web", "namespace": "ns"}, "containers": [app, side]}
    if swap:
        node[SWAP] = s(1536 * 1024, 512 * 1024)
        pod[SWAP] = s(100)
        app[SWAP] = s(40, 960)
        side[SWAP] = s(7)  # no limit
    return {"node": node, "pods": [pod]}


def parsed(text: str) -> dict[str, tuple[str, str, dict[tuple[tuple[str, str], ...], float]]]:
    return {
        f.name: (
            f.type,
            f.documentation,
            {tuple(sorted(x.labels.items())): x.value for x in f.samples},
        )
        for f in text_string_to_metric_families(text)
    }


def test_swap_series_of_the_node_pods_and_containers() -> None:
    got = parsed(resource_metrics(summary(swap=True), now_ms=NOW_MS))
    ref = (("namespace", "ns"), ("pod", "web"))
    app = tuple(sorted((*ref, ("container", "app"))))
    side = tuple(sorted((*ref, ("container", "side"))))
    assert got["node_swap_usage_bytes"][2] == {(): 1536 * 1024}
    assert got["pod_swap_usage_bytes"][2] == {ref: 100}
    assert got["container_swap_usage_bytes"][2] == {app: 40, side: 7}
    assert got["container_swap_limit_bytes"][2] == {app: 1000}  # available + usage
    for name in (
        "node_swap_usage_bytes",
        "pod_swap_usage_bytes",
        "container_swap_usage_bytes",
        "container_swap_limit_bytes",
    ):
        kind, help_text, _ = got[name]
        assert kind == "gauge"
        assert help_text.startswith("[ALPHA] Current ")
        assert help_text.endswith(". Reported only on non-windows systems")
    # the CPU and memory families keep their [STABLE] help
    assert got["node_memory_working_set_bytes"][1].startswith("[STABLE] ")
    assert got["node_memory_working_set_bytes"][2] == {(): 3000}


def test_no_swap_in_the_summary_no_swap_samples() -> None:
    got = parsed(resource_metrics(summary(swap=False), now_ms=NOW_MS))
    for name in ("node_swap_usage_bytes", "pod_swap_usage_bytes", "container_swap_usage_bytes"):
        assert got[name][2] == {}
    assert got["container_swap_limit_bytes"][2] == {}
    # a failed summary: the scrape error, and every family still declared
    failed = parsed(resource_metrics(None, now_ms=NOW_MS))
    assert failed["resource_scrape_error"][2] == {(): 1.0}
    assert failed["node_swap_usage_bytes"][0] == "gauge"

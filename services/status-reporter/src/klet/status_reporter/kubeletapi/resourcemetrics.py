"""`/metrics/resource`: the CPU and memory series metrics-server scrapes, with upstream's
metric names and help texts ([STABLE], the swap ones [ALPHA]), rendered from a
`/stats/summary` document.

Swap, as upstream's resource collector reads the Summary's `swap`: the node's and each
pod's `swapUsageBytes`, each container's usage and limit (`container_swap_limit_bytes`:
its available bytes plus its usage, so the cgroup's limit; none without a limit).

Pure: the summary comes in, Prometheus text format comes out, each sample stamped with
the scrape time (metrics-server reads the timestamps). A failed summary yields only
`resource_scrape_error 1`, as upstream reports a failed collection.
"""

from __future__ import annotations

from datetime import UTC, datetime

from klet.model.types import JSON

_SWAP_HELP = " Reported only on non-windows systems"
# (name, type, stability, help), in upstream's Describe order.
_RESOURCE_METRICS = (
    (
        "node_cpu_usage_seconds_total",
        "counter",
        "STABLE",
        "Cumulative cpu time consumed by the node in core-seconds",
    ),
    (
        "node_memory_working_set_bytes",
        "gauge",
        "STABLE",
        "Current working set of the node in bytes",
    ),
    ("node_swap_usage_bytes", "gauge", "ALPHA", "Current swap usage of the node in bytes."),
    (
        "container_start_time_seconds",
        "gauge",
        "STABLE",
        "Start time of the container since unix epoch in seconds",
    ),
    (
        "container_cpu_usage_seconds_total",
        "counter",
        "STABLE",
        "Cumulative cpu time consumed by the container in core-seconds",
    ),
    (
        "container_memory_working_set_bytes",
        "gauge",
        "STABLE",
        "Current working set of the container in bytes",
    ),
    (
        "container_swap_usage_bytes",
        "gauge",
        "ALPHA",
        "Current amount of the container swap usage in bytes.",
    ),
    (
        "container_swap_limit_bytes",
        "gauge",
        "ALPHA",
        "Current amount of the container swap limit in bytes.",
    ),
    (
        "pod_cpu_usage_seconds_total",
        "counter",
        "STABLE",
        "Cumulative cpu time consumed by the pod in core-seconds",
    ),
    (
        "pod_memory_working_set_bytes",
        "gauge",
        "STABLE",
        "Current working set of the pod in bytes",
    ),
    (
        "pod_swap_usage_bytes",
        "gauge",
        "ALPHA",
        "Current amount of the pod swap usage in bytes.",
    ),
    (
        "resource_scrape_error",
        "gauge",
        "STABLE",
        "1 if there was an error while getting container metrics, 0 otherwise",
    ),
)


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    quoted = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(labels.items())
    )
    return "{" + quoted + "}"


def _epoch_s(rfc: str) -> float | None:
    try:
        return datetime.strptime(rfc, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def resource_metrics(summary: JSON | None, *, now_ms: int) -> str:
    """`/metrics/resource` (what metrics-server scrapes) from a summary, in the Prometheus
    text format with upstream's metric names; None = the summary failed (scrape error)."""
    samples: dict[str, list[str]] = {name: [] for name, _, _, _ in _RESOURCE_METRICS}

    def add(name: str, value: float | int | None, **labels: str) -> None:
        if value is not None:
            samples[name].append(f"{name}{_labels(**labels)} {value} {now_ms}")

    samples["resource_scrape_error"].append(f"resource_scrape_error {0 if summary else 1}")
    node = (summary or {}).get("node", {})
    cpu_ns = node.get("cpu", {}).get("usageCoreNanoSeconds")
    add("node_cpu_usage_seconds_total", None if cpu_ns is None else cpu_ns / 1e9)
    add("node_memory_working_set_bytes", node.get("memory", {}).get("workingSetBytes"))
    add("node_swap_usage_bytes", node.get("swap", {}).get("swapUsageBytes"))
    for pod in (summary or {}).get("pods", []):
        ref = {"namespace": pod["podRef"]["namespace"], "pod": pod["podRef"]["name"]}
        cpu_ns = pod.get("cpu", {}).get("usageCoreNanoSeconds")
        add("pod_cpu_usage_seconds_total", None if cpu_ns is None else cpu_ns / 1e9, **ref)
        add("pod_memory_working_set_bytes", pod.get("memory", {}).get("workingSetBytes"), **ref)
        add("pod_swap_usage_bytes", pod.get("swap", {}).get("swapUsageBytes"), **ref)
        for c in pod.get("containers", []):
            labels = {**ref, "container": c["name"]}
            cpu_ns = c.get("cpu", {}).get("usageCoreNanoSeconds")
            add(
                "container_cpu_usage_seconds_total",
                None if cpu_ns is None else cpu_ns / 1e9,
                **labels,
            )
            add(
                "container_memory_working_set_bytes",
                c.get("memory", {}).get("workingSetBytes"),
                **labels,
            )
            add("container_start_time_seconds", _epoch_s(c.get("startTime", "")), **labels)
            swap = c.get("swap", {})
            used, available = swap.get("swapUsageBytes"), swap.get("swapAvailableBytes")
            add("container_swap_usage_bytes", used, **labels)
            if available is not None:
                add("container_swap_limit_bytes", available + (used or 0), **labels)
    lines: list[str] = []
    for name, kind, stability, help_text in _RESOURCE_METRICS:
        if stability == "ALPHA":
            help_text += _SWAP_HELP
        lines += [
            f"# HELP {name} [{stability}] {help_text}",
            f"# TYPE {name} {kind}",
            *samples[name],
        ]
    return "\n".join(lines) + "\n"

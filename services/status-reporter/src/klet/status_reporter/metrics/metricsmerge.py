"""Merging the five services' Prometheus expositions into the one the kubelet API serves.

Pure functions over parsed metric families (`prometheus_client.core.Metric`), no I/O:
`nodemetrics.py` scrapes the services and calls these. Upstream's kubelet is one
process with one registry; klet is five, so one family may come from several of them
(`kubelet_runtime_operations_total` from every service that calls CRI,
`rest_client_requests_total` from every apiserver client, `klet_leader` from all five).
How they are joined:

- a family is identified by its name; the first source's HELP and TYPE are kept. A
  later family of the same name but another TYPE is dropped whole (and named in
  `Merged.conflicts`, for the caller to log): one family, one type, or Prometheus
  rejects the scrape.
- samples of different label sets are all kept (`klet_leader{service=...}`).
- the same series from several services: a counter's samples are added up (each
  process counts its own events: the node's count is their sum), and so are a
  histogram's and a summary's `_bucket`, `_count` and `_sum` when the bucket
  boundaries are the same (one series with the boundaries of the first otherwise: a
  sum over different boundaries would not be a histogram). A gauge, a summary's
  quantile or an untyped sample keeps the first source's value: a level is not a sum,
  and the sources come in an order that puts the more authoritative first (syncloop's
  `kubelet_running_pods` counts sandboxes from the runtime, as upstream; status-reporter's
  counts them from the reported statuses).

`process_*` and `python_*` families describe the process that exports them: only the
serving process's are kept (`without_process_families` for the others), as upstream
serves its one process's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from klet.obs import LEADER_METRIC
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = [
    "LEADER_METRIC",
    "PROBE_FAMILIES",
    "Merged",
    "leads",
    "merge",
    "parse",
    "render_families",
    "split_probes",
    "without_process_families",
]


PROCESS_PREFIXES = ("process_", "python_")
PROBE_FAMILIES = frozenset({"prober_probe_total", "prober_probe_duration_seconds"})
"""What upstream serves on /metrics/probes rather than /metrics (with its registry's
process_start_time_seconds). The parser names a counter family without `_total`."""
_SUMMED = frozenset({"counter", "histogram", "summary"})


def parse(text: str) -> list[Metric]:
    """The families of a text-format exposition. Raises ValueError when it is not one."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(f"not a Prometheus text exposition: {err}") from err


def _family_name(family: Metric) -> str:
    # The parser names a counter by its base name; its samples end in `_total`.
    return family.name + "_total" if family.type == "counter" else family.name


def leads(families: Iterable[Metric], service: str) -> bool | None:
    """Whether the exposition says `service`'s replica leads (`klet_leader{service} 1`);
    None when it says nothing about it."""
    for family in families:
        if family.name != LEADER_METRIC:
            continue
        for sample in family.samples:
            if sample.labels.get("service") == service:
                return sample.value == 1.0
    return None


def without_process_families(families: Iterable[Metric]) -> list[Metric]:
    """`families` without those about the exporting process (process_*, python_*)."""
    return [f for f in families if not f.name.startswith(PROCESS_PREFIXES)]


def split_probes(families: Iterable[Metric]) -> tuple[list[Metric], list[Metric]]:
    """(`/metrics` families, `/metrics/probes` families), as upstream splits them."""
    main: list[Metric] = []
    probes: list[Metric] = []
    for family in families:
        (probes if _family_name(family) in PROBE_FAMILIES else main).append(family)
    return main, probes


def _series_key(labels: dict[str, str], *, drop: str = "") -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


@dataclass
class _Family:
    """One merged family: its first HELP and TYPE, and its samples by series."""

    metric: Metric
    # series -> {(sample name, le or quantile): value}, in first-seen order
    series: dict[tuple[tuple[str, str], ...], dict[tuple[str, str], float]] = field(
        default_factory=dict
    )
    labels: dict[tuple[tuple[str, str], ...], dict[str, str]] = field(default_factory=dict)

    def add(self, family: Metric) -> None:
        incoming: dict[tuple[tuple[str, str], ...], dict[tuple[str, str], float]] = {}
        for sample in family.samples:
            bucket = sample.labels.get("le", "")
            key = _series_key(sample.labels, drop="le")
            incoming.setdefault(key, {})[(sample.name, bucket)] = sample.value
            self.labels.setdefault(key, {k: v for k, v in sample.labels.items() if k != "le"})
        kind = self.metric.type
        for key, values in incoming.items():
            mine = self.series.get(key)
            if mine is None:
                self.series[key] = dict(values)
            elif kind in _SUMMED and set(mine) == set(values):
                for point, value in values.items():
                    if kind == "summary" and "quantile" in self.labels[key]:
                        continue  # a quantile is not a sum
                    mine[point] += value
            # else: a gauge, an untyped sample, or other bucket boundaries: first wins

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        for key, values in self.series.items():
            labels = self.labels[key]
            for (name, bucket), value in values.items():
                yield name, ({**labels, "le": bucket} if bucket else labels), value


@dataclass(frozen=True)
class Merged:
    families: list[Metric]
    conflicts: list[str]
    """Families dropped from a later source for a TYPE that differs from the first's."""


def merge(sources: Sequence[Iterable[Metric]]) -> Merged:
    """One list of families from several expositions, first source first (see the
    module docstring for what is summed and what is kept)."""
    merged: dict[str, _Family] = {}
    conflicts: list[str] = []
    for families in sources:
        for family in families:
            have = merged.get(family.name)
            if have is None:
                have = merged[family.name] = _Family(
                    Metric(family.name, family.documentation, family.type, family.unit)
                )
            elif have.metric.type != family.type:
                conflicts.append(family.name)
                continue
            have.add(family)
    out = []
    for entry in merged.values():
        metric = entry.metric
        for name, labels, value in entry.samples():
            metric.add_sample(name, labels, value)
        out.append(metric)
    return Merged(out, conflicts)


class _Fixed(Collector):
    """A collector that yields given families (for `generate_latest`)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def render_families(families: list[Metric]) -> bytes:
    """`families` in the Prometheus text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry)

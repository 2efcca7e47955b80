"""kubelet_container_log_filesystem_used_bytes (metrics/logusage.py) over a tmp_path
podLogsDir: each container directory of each pod the view lists is measured as
/stats/summary measures a container's logs, served under upstream's labels (uid,
namespace, pod, container) from the last measurement; a pod the view no longer lists,
or one without a log directory, has no series; the PodList is read as the pod cache
gives it."""

from __future__ import annotations

from pathlib import Path

from klet.model.types import JSON
from klet.stats.host import dir_usage
from klet.status_reporter.metrics.logusage import (
    NAME,
    ContainerLogUsage,
    PodRef,
    measure,
    pod_refs,
)
from prometheus_client import CollectorRegistry, generate_latest

WEB = {"metadata": {"uid": "u1", "namespace": "ns", "name": "web"}}
DB = {"metadata": {"uid": "u2", "namespace": "ns", "name": "db"}}


class View:
    def __init__(self, *pods: JSON) -> None:
        self.pods = list(pods)

    def pod_list(self) -> JSON:
        return {"kind": "PodList", "items": self.pods}


def write_log(root: Path, pod_dir: str, container: str, restart: int, size: int) -> Path:
    d = root / pod_dir / container
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{restart}.log").write_bytes(b"x" * size)
    return d


def test_pod_refs_of_a_pod_list() -> None:
    pods = {"items": [WEB, {"metadata": {"uid": "u3", "name": "bare"}}, {"metadata": {}}, 7]}
    assert pod_refs(pods) == [PodRef("u1", "ns", "web"), PodRef("u3", "default", "bare")]
    assert pod_refs({}) == []


async def test_each_listed_containers_log_directory_is_served(tmp_path: Path) -> None:
    app = write_log(tmp_path, "ns_web_u1", "app", 0, 10_000)
    write_log(tmp_path, "ns_web_u1", "app", 1, 5_000)  # a restart's file counts too
    side = write_log(tmp_path, "ns_web_u1", "side", 0, 100)
    write_log(tmp_path, "ns_gone_u9", "app", 0, 100)  # a pod the view does not list
    view = View(WEB, DB)  # db has no log directory yet
    registry = CollectorRegistry()
    usage = ContainerLogUsage(registry, pods=view, pod_logs_dir=tmp_path)

    def value(container: str) -> float | None:
        labels = {"uid": "u1", "namespace": "ns", "pod": "web", "container": container}
        return registry.get_sample_value(NAME, labels)

    assert value("app") is None  # nothing measured yet
    await usage.measure_once()
    got = value("app")
    assert got is not None and got == dir_usage(app).bytes and got >= 15_000
    assert value("side") == dir_usage(side).bytes
    page = generate_latest(registry).decode()
    assert "u9" not in page and 'pod="db"' not in page
    assert f"# TYPE {NAME} gauge" in page

    view.pods = [DB]  # web left the node's pods: its series go at the next measurement
    await usage.measure_once()
    assert value("app") is None


def test_measure_skips_files_beside_the_container_directories(tmp_path: Path) -> None:
    write_log(tmp_path, "ns_web_u1", "app", 0, 10)
    (tmp_path / "ns_web_u1" / "stray.log").write_text("x")
    assert list(measure(tmp_path, [PodRef("u1", "ns", "web")])) == [("u1", "ns", "web", "app")]

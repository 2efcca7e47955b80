"""bench/volumes.py's per-pod split of the agent's CPU by process: each side's median per
pod, with the medians of the first and the last third of its pods (where a cost that grows
with the pods a node has run would show)."""

from __future__ import annotations

from bench.volumes import per_pod_by_process


def test_medians_per_process_with_the_first_and_last_third() -> None:
    pods = [
        {"side": "klet", "cpu_by_process": {"syncloop": 0.1 * i, "status-reporter": 0.05}}
        for i in range(1, 7)
    ] + [{"side": "kubelet", "cpu_by_process": {"kubelet": 0.2}}]
    out = per_pod_by_process(pods)
    assert list(out) == ["klet", "kubelet"]
    assert list(out["klet"]) == ["syncloop", "status-reporter"]  # the larger first
    assert out["klet"]["syncloop"] == "0.350 (0.150 / 0.550)"
    assert out["klet"]["status-reporter"] == "0.050 (0.050 / 0.050)"
    assert out["kubelet"] == {"kubelet": "0.200 (0.200 / 0.200)"}


def test_a_process_missing_from_a_pod_counts_zero_there() -> None:
    pods = [
        {"side": "klet", "cpu_by_process": {"syncloop": 0.2}},
        {"side": "klet", "cpu_by_process": {"syncloop": 0.2, "image-gc": 0.3}},
        {"side": "klet"},  # a run before the split was recorded
    ]
    assert per_pod_by_process(pods)["klet"]["image-gc"] == "0.000 (0.000 / 0.000)"

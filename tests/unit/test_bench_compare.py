"""bench/compare.py's pure helpers: percentiles, the tail statistic, the table cells and
ratio, the README section replacement, CPU from clock ticks and the env parsing."""

from __future__ import annotations

import pytest

from bench.compare import (
    CLK_TCK,
    README_BEGIN,
    README_END,
    Row,
    cpu_cores,
    env_ints,
    markdown_table,
    percentile,
    replace_section,
    row_cells,
    tail,
)


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([5.0], 50, 5.0),
        ([1.0, 2.0, 3.0], 50, 2.0),
        ([3.0, 1.0, 2.0, 4.0], 50, 2.5),
        ([0.0, 10.0], 95, 9.5),
        ([1.0, 2.0, 3.0], 100, 3.0),
        ([1.0, 2.0, 3.0], 0, 1.0),
    ],
)
def test_percentile_interpolates_between_closest_ranks(
    samples: list[float], q: float, expected: float
) -> None:
    assert percentile(samples, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)


def test_tail_is_the_max_below_100_samples_and_p99_from_100() -> None:
    few = [float(i) for i in range(99)]
    assert tail(few) == (98.0, "max")
    many = [float(i) for i in range(101)]
    value, name = tail(many)
    assert name == "p99"
    assert value == pytest.approx(99.0)


def test_row_cells_give_medians_tails_and_the_ratio_of_medians() -> None:
    row = Row("start", "s", [0.2, 0.3, 0.4], [0.1, 0.2])
    assert row_cells(row) == [
        "start",
        "3/2",
        "300 ms",
        "400 ms (max)",
        "150 ms",
        "200 ms (max)",
        "2.00x",
    ]


def test_row_cells_of_one_sample_have_no_tail_and_long_times_are_in_seconds() -> None:
    row = Row("restart", "s", [12.34], [2.0])
    assert row_cells(row) == ["restart", "1/1", "12.3 s", "", "2000 ms", "", "6.17x"]


def test_row_cells_with_a_side_missing_or_a_zero_median() -> None:
    assert row_cells(Row("x", "count", [1.0], []))[-1] == "-"
    assert row_cells(Row("x", "count", [0.0], [0.0]))[-1] == "="
    assert row_cells(Row("x", "count", [2.0], [0.0]))[-1] == "inf"
    assert row_cells(Row("x", "MB", [512.4], [98.0]))[2] == "512 MB"
    assert row_cells(Row("x", "cpu-s", [6.25], [2.5]))[2::2] == ["6.2 CPU-s", "2.5 CPU-s", "2.50x"]


def test_markdown_table_has_a_header_a_rule_and_one_line_per_row() -> None:
    lines = markdown_table([Row("a", "cores", [0.01], [0.02])]).splitlines()
    assert len(lines) == 3
    assert lines[1] == "|---|---|---|---|---|---|---|"
    assert lines[2] == "| a | 1/1 | 0.010 |  | 0.020 |  | 0.50x |"


def test_replace_section_replaces_between_the_markers_only() -> None:
    text = f"intro\n{README_BEGIN}\nold\n{README_END}\noutro\n"
    assert replace_section(text, "new\n") == f"intro\n{README_BEGIN}\nnew\n{README_END}\noutro\n"


def test_replace_section_appends_markers_when_missing() -> None:
    assert replace_section("intro\n", "t") == f"intro\n\n{README_BEGIN}\nt\n{README_END}\n"


def test_cpu_cores_from_clock_ticks() -> None:
    assert cpu_cores(0, CLK_TCK, 2.0) == pytest.approx(0.5)
    assert cpu_cores(5, 5, 0.0) == 0.0


def test_env_ints_reads_a_comma_list_or_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPARE_TEST_LIST", "10, 30,")
    assert env_ints("COMPARE_TEST_LIST", (1,)) == [10, 30]
    monkeypatch.setenv("COMPARE_TEST_LIST", " ")
    assert env_ints("COMPARE_TEST_LIST", (1,)) == [1]


def test_the_idle_cpu_is_reported_as_its_mean_and_p95_beside_the_median() -> None:
    """A median of the 1 s samples hides the periodic passes (GC, eviction, the safety-net
    relist); the mean and the p95 of the window show them, one number per side."""
    from bench.compare import Config, table_rows

    cfg = Config(rounds=1, singles=1, bursts=[], idle_pods=[110, 250], idle_s=10)
    quiet_then_busy = [0.01] * 9 + [0.5]
    samples = {
        "idle110_cores": {"klet": quiet_then_busy, "kubelet": [0.05] * 10},
        "idle250_cores": {"klet": [0.02] * 10, "kubelet": [0.04] * 10},
    }
    rows = {r.label: r for r in table_rows(samples, cfg)}
    assert percentile(quiet_then_busy, 50) == 0.01
    mean = rows["idle, 110 pods: CPU mean over the window (cores)"]
    assert mean.klet == [pytest.approx(0.059)] and mean.upstream == [pytest.approx(0.05)]
    p95 = rows["idle, 110 pods: CPU p95 over the window (cores)"]
    assert p95.klet == [pytest.approx(0.2795)] and p95.upstream == [pytest.approx(0.05)]
    labels = list(rows)
    assert (
        labels.index("idle, 110 pods: CPU mean over the window (cores)")
        == labels.index("idle, 110 pods: CPU per 1 s sample (cores)") + 1
    )
    # 250 pods get the same rows but no restart of their own; maxPods covers them.
    assert rows["idle, 250 pods: CPU mean over the window (cores)"].upstream == [
        pytest.approx(0.04)
    ]
    assert "agent restarted, 110 pods -> all Running+ready" in rows
    assert not [label for label in rows if "restarted, 250" in label]
    assert cfg.max_pods == 250


def test_each_burst_is_set_against_the_raw_cri_floor_of_the_same_run() -> None:
    from bench.compare import Config, row_cells, table_rows

    cfg = Config(rounds=2, singles=1, bursts=[110], idle_pods=[], idle_s=10)
    samples = {
        "burst110_floor": {"cri": [10.0, 12.0]},
        "burst110_all": {"klet": [12.1, 13.1], "kubelet": [22.0, 24.0]},
    }
    rows = {r.label: r for r in table_rows(samples, cfg)}
    floor = rows["burst 110: raw CRI floor, all started (klet's containerd)"]
    assert floor.klet == [10.0, 12.0] and floor.upstream == []
    ratio = rows["burst 110: all Running+ready / raw CRI floor"]
    assert ratio.klet == [pytest.approx(12.6 / 11.0)] and ratio.upstream == [pytest.approx(23 / 11)]
    assert row_cells(ratio)[2:] == ["1.15x", "", "2.09x", "", "0.55x"]
    assert cfg.max_pods == 110

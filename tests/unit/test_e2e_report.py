"""tools/e2e/report.py: ginkgo's JSON report of an e2e run read into results and written
as conformance/RESULTS.md.

Covers: specs the focus did not select are left out while specs skipped at run time are
kept; suite nodes (BeforeSuite, ReportAfterSuite) are not specs but their failures are
reported; a spec's file is its path below test/e2e/ and its area its first [sig-*];
every failure state counts as failed; a failure's reason is the first lines of the
message, bounded; the Markdown has the totals, a row per file with a total row, each
failure with its location and reason, and table cells with `|` escaped; its heading
names the selection (the node suite's unless told).
"""

from __future__ import annotations

from typing import Any

from tools.e2e.report import (
    REASON_CHARS,
    REASON_LINES,
    RunInfo,
    parse_report,
    reason_of,
    relative_file,
    render_markdown,
)

MOD = "k8s.io/kubernetes@v1.34.4/test/e2e/"


def spec(
    leaf: str,
    file: str,
    state: str,
    *,
    containers: tuple[str, ...] = ("[sig-node] Pods",),
    seconds: float = 1.0,
    message: str | None = None,
    kind: str = "It",
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "ContainerHierarchyTexts": list(containers),
        "LeafNodeText": leaf,
        "LeafNodeType": kind,
        "LeafNodeLocation": {"FileName": MOD + file, "LineNumber": 42},
        "State": state,
        "RunTime": int(seconds * 1e9),
    }
    if message is not None:
        report["Failure"] = {
            "Message": message,
            "Location": {"FileName": MOD + "framework/pod/wait.go", "LineNumber": 7},
        }
    return report


def suite(*specs: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "StartTime": "2026-11-26T07:00:00Z",
            "RunTime": int(600 * 1e9),
            "SpecReports": list(specs),
        }
    ]


REPORT = suite(
    spec(
        "[SynchronizedBeforeSuite]",
        "e2e.go",
        "passed",
        containers=(),
        kind="SynchronizedBeforeSuite",
    ),
    spec("should run [NodeConformance]", "common/node/pods.go", "passed"),
    spec(
        "should be updated [NodeConformance]",
        "common/node/pods.go",
        "failed",
        message="boom\n\nline2",
    ),
    spec(
        "should mount [NodeConformance]",
        "common/storage/empty_dir.go",
        "timedout",
        containers=("[sig-storage] EmptyDir volumes",),
        message="timed out | waiting",
    ),
    # not selected by the focus: no run time, no message
    spec("other", "apps/deployment.go", "skipped", seconds=0),
    # selected, then skipped by e2eskipper at run time
    spec(
        "needs a provider [NodeConformance]",
        "common/node/kubelet.go",
        "skipped",
        message="Only supported for providers [gce]",
    ),
)


def test_relative_file() -> None:
    assert relative_file(MOD + "common/node/pods.go") == "common/node/pods.go"
    assert relative_file("elsewhere/x.go") == "elsewhere/x.go"


def test_selected_specs_only() -> None:
    results = parse_report(REPORT)
    assert [s.file for s in results.specs] == [
        "common/node/pods.go",
        "common/node/pods.go",
        "common/storage/empty_dir.go",
        "common/node/kubelet.go",
    ]
    assert (results.passed, results.failed, results.skipped) == (1, 2, 1)
    assert results.seconds == 600
    assert results.problems == ()


def test_failure_fields() -> None:
    results = parse_report(REPORT)
    first, second = results.failures
    assert first.text == "[sig-node] Pods should be updated [NodeConformance]"
    assert first.reason == "boom\nline2"
    assert first.failure_location == "framework/pod/wait.go:7"
    assert first.area == "[sig-node]"
    assert second.state == "timedout" and second.failed
    assert second.area == "[sig-storage]"


def test_suite_node_failure_is_a_problem() -> None:
    results = parse_report(
        suite(
            spec(
                "[SynchronizedBeforeSuite]",
                "e2e.go",
                "failed",
                containers=(),
                kind="SynchronizedBeforeSuite",
                message="no nodes",
            )
        )
    )
    assert results.specs == ()
    assert [(p.node, p.reason) for p in results.problems] == [
        ("SynchronizedBeforeSuite", "no nodes")
    ]


def test_reason_is_bounded() -> None:
    many = "\n".join(f"line {i}" for i in range(20))
    assert reason_of(many).splitlines() == [f"line {i}" for i in range(REASON_LINES)]
    long = reason_of("x" * 5000)
    assert len(long) == REASON_CHARS and long.endswith("...")


def test_markdown() -> None:
    info = RunInfo(
        command="python -m tools.e2e.conformance",
        focus="F",
        skip="S",
        procs=4,
        wall_seconds=900,
        versions={"e2e.test": "v1.34.4"},
    )
    text = render_markdown(parse_report(REPORT), info)
    assert "4 specs selected, **1 passed, 2 failed, 1 skipped**" in text
    assert "| common/node/pods.go | [sig-node] | 1 | 1 | 0 |" in text
    assert "| common/storage/empty_dir.go | [sig-storage] | 0 | 1 | 0 |" in text
    assert "| common/node/kubelet.go | [sig-node] | 0 | 0 | 1 |" in text
    assert "| **total** | | 1 | 2 | 1 |" in text
    assert "### [sig-storage] EmptyDir volumes should mount [NodeConformance]" in text
    assert "common/storage/empty_dir.go:42, timedout after 1 s, at framework/pod/wait.go:7" in text
    assert "timed out | waiting" in text  # inside a code block: left as it is
    assert "Only supported for providers [gce]" in text
    assert "- e2e.test v1.34.4" in text
    assert "suite run time 10.0 min (600 s)" in text


def test_known_difference_is_given_with_the_failure() -> None:
    info = RunInfo(
        command="c",
        focus="F",
        skip="S",
        procs=1,
        wall_seconds=1,
        versions={},
        known={r"EmptyDir volumes should mount": "environment: no tmpfs here"},
    )
    text = render_markdown(parse_report(REPORT), info)
    assert text.count("Known difference:") == 1
    mount = text.index("### [sig-storage] EmptyDir volumes should mount")
    assert text.index("Known difference: environment: no tmpfs here") > mount


def test_title_names_the_selection() -> None:
    info = RunInfo(
        command="c", focus="f", skip="s", procs=1, wall_seconds=1.0, versions={}, title="Storage"
    )
    text = render_markdown(parse_report(suite()), info)
    assert text.startswith("# Storage\n")
    assert render_markdown(parse_report(suite()), RunInfo("c", "f", "s", 1, 1.0, {})).startswith(
        "# Kubernetes [NodeConformance] e2e results for klet\n"
    )

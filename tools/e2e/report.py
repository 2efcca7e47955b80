"""The results of one e2e run, read from ginkgo's JSON report and written as Markdown.

ginkgo's JSON report (`--json-report`) carries, per spec, its texts, the source file of
its `It`, its state, run time and failure; the JUnit file the suite writes itself
(`--report-dir`) has no file names, so the summary is built from the JSON. Pure: the
caller reads the report and writes the Markdown.

A spec's file is its `It`'s path below `test/e2e/` (`common/node/pods.go`); its area
the first `[sig-*]` of its text. The reason of a failure is the first lines of ginkgo's
failure message, which names what was expected and what was seen.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# ginkgo's SpecState names; the ones other than passed/skipped/pending are failures.
PASSED = "passed"
SKIPPED = "skipped"
PENDING = "pending"
FAILURE_STATES = frozenset({"failed", "aborted", "panicked", "interrupted", "timedout"})
REASON_LINES = 6
REASON_CHARS = 600
TITLE = "Kubernetes [NodeConformance] e2e results for klet"


@dataclass(frozen=True)
class SpecResult:
    """One `It` of the run."""

    text: str  # the full spec text: the containers' texts and the It's, space-joined
    file: str  # below test/e2e/, e.g. common/node/pods.go
    line: int
    state: str  # ginkgo's: passed, skipped, failed, timedout, ...
    seconds: float
    reason: str = ""  # failed ones: the first lines of the failure message
    failure_location: str = ""  # failed ones: file:line of the failed assertion

    @property
    def failed(self) -> bool:
        return self.state in FAILURE_STATES

    @property
    def area(self) -> str:
        match = re.search(r"\[sig-[a-z-]+\]", self.text)
        return match.group(0) if match else "-"


@dataclass(frozen=True)
class SuiteProblem:
    """A failure outside any `It` (a BeforeSuite, a ReportAfterSuite): it can fail the
    whole run without failing a spec."""

    node: str
    state: str
    reason: str


@dataclass(frozen=True)
class Results:
    specs: tuple[SpecResult, ...]  # those that were selected to run (skips included)
    problems: tuple[SuiteProblem, ...]
    start: str  # RFC 3339, from the report
    seconds: float

    def count(self, state: str) -> int:
        return sum(1 for s in self.specs if s.state == state)

    @property
    def passed(self) -> int:
        return self.count(PASSED)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.specs if s.failed)

    @property
    def skipped(self) -> int:
        return self.count(SKIPPED) + self.count(PENDING)

    @property
    def failures(self) -> list[SpecResult]:
        return sorted((s for s in self.specs if s.failed), key=lambda s: (s.file, s.text))


def relative_file(path: str) -> str:
    """`k8s.io/kubernetes@v1.34.4/test/e2e/common/node/pods.go` -> `common/node/pods.go`."""
    _, sep, rest = path.partition("test/e2e/")
    return rest if sep else path


def reason_of(message: str) -> str:
    """The first REASON_LINES non-blank lines of a failure message, at most REASON_CHARS."""
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    text = "\n".join(lines[:REASON_LINES])
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _spec(report: Mapping[str, Any]) -> SpecResult:
    texts = [*(report.get("ContainerHierarchyTexts") or []), report.get("LeafNodeText", "")]
    location = report.get("LeafNodeLocation") or {}
    failure = report.get("Failure") or {}
    where = failure.get("Location") or {}
    return SpecResult(
        text=" ".join(t for t in texts if t),
        file=relative_file(location.get("FileName", "")),
        line=int(location.get("LineNumber", 0)),
        state=str(report.get("State", "")),
        seconds=float(report.get("RunTime", 0)) / 1e9,
        reason=reason_of(str(failure.get("Message", ""))) if failure else "",
        failure_location=(
            f"{relative_file(where.get('FileName', ''))}:{where.get('LineNumber', 0)}"
            if where
            else ""
        ),
    )


def parse_report(suites: Sequence[Mapping[str, Any]]) -> Results:
    """Results from ginkgo's JSON report (a list of suite reports; the e2e run has one).

    Specs that ginkgo skipped because the focus did not select them are left out: a
    spec is kept when it ran, or when it was selected and then skipped at run time
    (`e2eskipper`, a failed BeforeSuite), which the report tells apart by a failure
    message or a run time.
    """
    specs: list[SpecResult] = []
    problems: list[SuiteProblem] = []
    start = ""
    seconds = 0.0
    for suite in suites:
        start = start or str(suite.get("StartTime", ""))
        seconds += float(suite.get("RunTime", 0)) / 1e9
        for report in suite.get("SpecReports") or []:
            kind = report.get("LeafNodeType", "")
            if kind != "It":
                if report.get("State") in FAILURE_STATES:
                    failure = report.get("Failure") or {}
                    problems.append(
                        SuiteProblem(
                            node=kind,
                            state=str(report["State"]),
                            reason=reason_of(str(failure.get("Message", ""))),
                        )
                    )
                continue
            if report.get("State") == SKIPPED and not _ran_or_skipped_at_run_time(report):
                continue
            specs.append(_spec(report))
    return Results(specs=tuple(specs), problems=tuple(problems), start=start, seconds=seconds)


def _ran_or_skipped_at_run_time(report: Mapping[str, Any]) -> bool:
    failure = report.get("Failure") or {}
    return bool(failure.get("Message")) or float(report.get("RunTime", 0)) > 0


@dataclass(frozen=True)
class RunInfo:
    """What the Markdown says about the run besides the specs."""

    command: str
    focus: str
    skip: str
    procs: int
    wall_seconds: float
    versions: Mapping[str, str]  # component -> version
    notes: Sequence[str] = ()  # free text lines
    # A pattern of a spec's text -> why that failure is not klet's (re.search).
    known: Mapping[str, str] = field(default_factory=dict)
    title: str = TITLE  # the Markdown's heading: what was run

    def known_reason(self, spec: SpecResult) -> str:
        return next((why for pat, why in self.known.items() if re.search(pat, spec.text)), "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min ({seconds:.0f} s)"


def per_file(specs: Iterable[SpecResult]) -> list[tuple[str, str, int, int, int]]:
    """(file, area, passed, failed, skipped) per file, by file name."""
    passed: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    areas: dict[str, str] = {}
    for spec in specs:
        areas.setdefault(spec.file, spec.area)
        if spec.state == PASSED:
            passed[spec.file] += 1
        elif spec.failed:
            failed[spec.file] += 1
        else:
            skipped[spec.file] += 1
    return [(f, areas[f], passed[f], failed[f], skipped[f]) for f in sorted(areas)]


def render_markdown(results: Results, info: RunInfo) -> str:
    """conformance/RESULTS.md: totals, the table per file, each failure with its reason."""
    out = [
        f"# {info.title}",
        "",
        f"Run of {results.start or 'unknown date'} by `{info.command}`: "
        f"{len(results.specs)} specs selected, **{results.passed} passed, "
        f"{results.failed} failed, {results.skipped} skipped**.",
        "",
        f"- suite run time {_minutes(results.seconds)}; the whole command (builds, cluster, "
        f"suite) {_minutes(info.wall_seconds)}; ginkgo processes: {info.procs}",
        f"- focus `{info.focus}`",
        f"- skip `{info.skip}`",
    ]
    out += [f"- {name} {version}" for name, version in info.versions.items()]
    if info.notes:
        out += ["", *info.notes]
    out += [
        "",
        "## Per file",
        "",
        "| file (test/e2e/) | area | passed | failed | skipped |",
        "|---|---|---:|---:|---:|",
    ]
    for file, area, npassed, nfailed, nskipped in per_file(results.specs):
        out.append(f"| {file} | {area} | {npassed} | {nfailed} | {nskipped} |")
    out.append(f"| **total** | | {results.passed} | {results.failed} | {results.skipped} |")
    if results.problems:
        out += ["", "## Failures outside the specs", ""]
        for problem in results.problems:
            out.append(f"- {problem.node} ({problem.state}): {_cell(problem.reason)}")
    out += ["", "## Failures", ""]
    if not results.failures:
        out.append("None.")
    for spec in results.failures:
        out += [
            f"### {_cell(spec.text)}",
            "",
            f"{spec.file}:{spec.line}, {spec.state} after {spec.seconds:.0f} s"
            + (f", at {spec.failure_location}" if spec.failure_location else ""),
            "",
            "```",
            spec.reason or "(no message)",
            "```",
            "",
        ]
        if why := info.known_reason(spec):
            out += [f"Known difference: {why}", ""]
    skipped = sorted((s for s in results.specs if s.state in (SKIPPED, PENDING)), key=_by_file)
    if skipped:
        out += ["", "## Skipped at run time", ""]
        out += [f"- {_cell(s.text)} ({s.file}): {_cell(s.reason) or s.state}" for s in skipped]
    return "\n".join(out).rstrip() + "\n"


def _by_file(spec: SpecResult) -> tuple[str, str]:
    return (spec.file, spec.text)

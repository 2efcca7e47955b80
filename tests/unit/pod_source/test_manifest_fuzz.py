"""A short seeded subset of the manifest fuzzer (tests/fuzz/manifests.py; the full
10,000 cases run under `make fuzz-manifests`): a few hundred mutated YAML and JSON
manifests through the file source's scan and HttpSource.run_once give no crash, only
clear rejections tied to their file or URL, and no accepted pod that syncloop would
refuse."""

from __future__ import annotations

from collections import Counter

from tests.fuzz.manifests import Mutator, report, run


def test_the_generator_is_seeded_and_varied() -> None:
    one, two = Mutator(3), Mutator(3)
    first = [one.case(i) for i in range(200)]
    again = [two.case(i) for i in range(200)]
    assert [c.data for c in first] == [c.data for c in again]
    kinds = Counter(m for c in first for m in c.mutations)
    assert len(kinds) >= 15, kinds
    assert {c.fmt for c in first} == {"yaml", "json"}


def test_a_seeded_subset_of_mutated_manifests() -> None:
    outcome, seconds = run(400, 7)
    text = report(outcome, seconds, 400)
    assert not outcome.crashes, text
    assert not outcome.unclear, text
    assert not outcome.inconsistent, text
    assert outcome.accepted > 0 and sum(outcome.rejected.values()) > 200, text

"""Container log rotation decisions (upstream's container log manager): nothing below the
size limit or with rotation off; leftovers of an interrupted rotation removed; the
oldest rotated files removed down to maxFiles-2; plain rotated files compressed; the
current log renamed to a UTC timestamp; no rename over an existing rotated file; a log
below the max size needs nothing whatever is around it (the manager then lists nothing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from klet.model.logfiles import rotated_name, rotations_of
from klet.syncloop.containers.logrotation import (
    RotationPlan,
    RotationPolicy,
    needs_rotation,
    plan_rotation,
)

NOW = datetime(2026, 11, 25, 7, 1, 2, tzinfo=UTC)
STAMP = "20261125-070102"
POLICY = RotationPolicy(max_size=1000, max_files=3)


@pytest.mark.parametrize(
    ("names", "size", "policy", "plan"),
    [
        # below the limit: nothing, not even clean-up (upstream cleans only when rotating)
        (["0.log", "0.log.1.tmp"], 999, POLICY, RotationPlan()),
        # rotation off
        (["0.log"], 10**9, RotationPolicy(max_size=-1, max_files=3), RotationPlan()),
        # first rotation: just the rename
        (["0.log"], 1000, POLICY, RotationPlan(rotate_to=f"0.log.{STAMP}")),
        # second: the previous rotated file is kept (maxFiles-2 = 1) and compressed
        (
            ["0.log", "0.log.20261125-070000"],
            5000,
            POLICY,
            RotationPlan(compress=("0.log.20261125-070000",), rotate_to=f"0.log.{STAMP}"),
        ),
        # third: the oldest goes, compressed ones stay compressed
        (
            ["0.log", "0.log.20261125-070000.gz", "0.log.20261125-070030"],
            5000,
            POLICY,
            RotationPlan(
                remove=("0.log.20261125-070000.gz",),
                compress=("0.log.20261125-070030",),
                rotate_to=f"0.log.{STAMP}",
            ),
        ),
        # leftovers: a .tmp, and a plain file whose .gz exists; other logs untouched
        (
            [
                "0.log",
                "0.log.20261125-070000",
                "0.log.20261125-070000.gz",
                "0.log.20261125-070030.tmp",
                "1.log",
                "1.log.20261125-060000",
                "0.logfile",
            ],
            1000,
            RotationPolicy(max_size=1000, max_files=5),
            RotationPlan(
                remove=("0.log.20261125-070000", "0.log.20261125-070030.tmp"),
                rotate_to=f"0.log.{STAMP}",
            ),
        ),
        # maxFiles 2: no rotated file survives this rotation but the new one
        (
            ["0.log", "0.log.20261125-070000.gz", "0.log.20261125-070030"],
            1000,
            RotationPolicy(max_size=1000, max_files=2),
            RotationPlan(
                remove=("0.log.20261125-070000.gz", "0.log.20261125-070030"),
                rotate_to=f"0.log.{STAMP}",
            ),
        ),
        # a rotation in this very second already happened: wait for the next round
        (["0.log", f"0.log.{STAMP}"], 5000, POLICY, RotationPlan()),
        (["0.log", f"0.log.{STAMP}.gz"], 5000, POLICY, RotationPlan()),
    ],
)
def test_plan_rotation(
    names: list[str], size: int, policy: RotationPolicy, plan: RotationPlan
) -> None:
    assert plan_rotation("0.log", names, size=size, policy=policy, now=NOW) == plan


def test_rotated_names_are_utc_and_sort_by_age() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=-5)))
    assert rotated_name("3.log", local) == f"3.log.{STAMP}"
    later = rotated_name("3.log", NOW + timedelta(seconds=9))
    in_use, unused = rotations_of("3.log", [later + ".gz", f"3.log.{STAMP}", "3.log"])
    assert in_use == [f"3.log.{STAMP}", later + ".gz"] and unused == []


@pytest.mark.parametrize(
    ("size", "policy", "needed"),
    [
        (999, POLICY, False),
        (1000, POLICY, True),
        (10**9, RotationPolicy(max_size=-1, max_files=3), False),
    ],
)
def test_needs_rotation_is_the_plans_first_rule(
    size: int, policy: RotationPolicy, needed: bool
) -> None:
    assert needs_rotation(size, policy) is needed
    leftovers = ["0.log", "0.log.1.tmp", "0.log.20261124-070102", "0.log.20261123-070102.gz"]
    plan = plan_rotation("0.log", leftovers, size=size, policy=policy, now=NOW)
    assert (plan != RotationPlan()) is needed

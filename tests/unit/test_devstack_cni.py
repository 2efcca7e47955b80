"""The dev stack's subnet claims: two stacks on one machine never get the same pod
subnet, even before either has a bridge up (only routed subnets were skipped before);
an owner gets its own claim back, a claim whose owner directory is gone is taken over,
a released subnet is free again, routed subnets are skipped, and a full range is an
error."""

from __future__ import annotations

import ipaddress
from functools import partial
from pathlib import Path

import pytest
from klet.devstack import CniNetwork, claim_subnet, release_subnet
from klet.devstack.cni import _candidates

RANGE = 51  # 10.200.0.0/16 to 10.250.0.0/16


def owner(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "stacks" / name
    path.mkdir(parents=True)
    return path


def holders(claims: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in claims.iterdir() if not p.name.startswith(".")}


def test_two_owners_hashing_to_the_same_subnet_get_different_ones(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    first: dict[str, str] = {}
    for i in range(500):
        name = f"s{i}"
        start = str(_candidates(str((tmp_path / "stacks" / name).resolve()))[0])
        if start in first:
            break
        first[start] = name
    else:
        pytest.fail("no two names hashing to one subnet")
    claim = partial(claim_subnet, claims_dir=claims, routed=set())
    a = claim(owner(tmp_path, first[start]))
    b = claim(owner(tmp_path, name))
    assert str(a) == start
    assert not a.overlaps(b)


def test_an_owner_gets_its_claim_back_until_it_releases_it(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claim = partial(claim_subnet, claims_dir=claims, routed=set())
    a = owner(tmp_path, "a")
    got = claim(a)
    assert claim(a) == got
    assert holders(claims) == {str(got.network_address): str(a.resolve())}
    release_subnet(a, claims_dir=claims)
    assert holders(claims) == {}


def test_a_claim_of_a_removed_owner_is_taken_over(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claim = partial(claim_subnet, claims_dir=claims, routed=set())
    gone = owner(tmp_path, "gone")
    stale = claim(gone)
    for i in range(RANGE - 1):
        claim(owner(tmp_path, f"live{i}"))
    last = owner(tmp_path, "last")
    with pytest.raises(RuntimeError, match="no free subnet"):
        claim(last)
    gone.rmdir()
    assert claim(last) == stale


def test_routed_subnets_are_skipped(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    a = owner(tmp_path, "a")
    start = _candidates(str(a.resolve()))[0]
    routed = {ipaddress.IPv4Network(f"{start.network_address}/24")}
    assert claim_subnet(a, claims_dir=claims, routed=routed) == _candidates(str(a.resolve()))[1]


def test_network_claims_at_first_use_and_releases_at_cleanup(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    one = CniNetwork(tmp_path / "one" / "cni", claims_dir=claims)
    two = CniNetwork(tmp_path / "two" / "cni", claims_dir=claims)
    assert not claims.exists()
    one.write()
    two.write()
    assert one.subnet != two.subnet
    assert str(one.subnet) in one.conflist_path.read_text()
    one.cleanup()
    assert list(holders(claims).values()) == [str((tmp_path / "two" / "cni").resolve())]

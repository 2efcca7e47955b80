"""tools/e2e/apiroute.py: the DNAT rule that gives a conformance run's pods the
`kubernetes` Service matches only that run's pod subnet and the Service's address and
port, carries its comment, and sends the packets to the relay. The relay itself and the
rule in the kernel are exercised by `python -m tools.e2e.conformance --preset
storage-csi` (the CSI sidecars list and watch through it)."""

from __future__ import annotations

import ipaddress

from tools.e2e.apiroute import RULE_COMMENT, dnat_rule


def test_the_rule_is_scoped_to_the_runs_pods_and_the_service() -> None:
    rule = dnat_rule(ipaddress.IPv4Network("10.77.0.0/16"), "10.0.0.1", ("10.77.0.1", 41234))
    assert rule[0] == "PREROUTING"
    pairs = dict(zip(rule[1::2], rule[2::2], strict=False))
    assert pairs["-s"] == "10.77.0.0/16" and pairs["-d"] == "10.0.0.1/32"
    assert pairs["-p"] == "tcp" and pairs["--dport"] == "443"
    assert rule[rule.index("--comment") + 1] == RULE_COMMENT
    assert rule[-3:] == ["DNAT", "--to-destination", "10.77.0.1:41234"]

"""klet.hostfs: a path is the host's own when this process shares PID 1's root, and
the same path under PID 1's root when it does not (a service in a pod with hostPID)."""

from __future__ import annotations

from pathlib import Path

from klet.hostfs import on_host, shares_host_root


def test_the_same_root_keeps_the_path() -> None:
    assert shares_host_root(Path("/"))
    assert on_host(Path("/var/lib/x"), host_root=Path("/")) == Path("/var/lib/x")


def test_another_root_puts_the_path_under_it(tmp_path: Path) -> None:
    assert not shares_host_root(tmp_path)
    assert on_host(Path("/var/lib/x"), host_root=tmp_path) == tmp_path / "var/lib/x"
    assert on_host(Path("relative"), host_root=tmp_path) == Path("relative")


def test_an_unreadable_host_root_keeps_our_view(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-proc" / "1" / "root"
    assert shares_host_root(missing)
    assert on_host(Path("/etc"), host_root=missing) == Path("/etc")

"""The bus ACL (klet.bus.acl) and `klet bus-acl`.

Covers: user names per node and service; the exact grants of a service (its own node's
keys only, one selector per key group, klet's functions by name and no Lua of its own,
limited to keys it may touch, its own lease only); node names that would widen a key
pattern refused; ACL file lines holding password hashes, never passwords; `klet
bus-acl` writing 0600 password files it keeps on a re-run, with `--acl-file` a whole
ACL file with the default user off (and the admin with `--admin-password-file`),
`--functions-file` writing the library, and `--apply` refusing a cleartext admin
password off loopback.
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from klet.bus.acl import (
    ACCESS,
    SERVICES,
    acl_file_lines,
    describe,
    service_rules,
    user_name,
)
from klet.bus.functions import FUNCTIONS, LIBRARY, library_code
from klet.cli.busacl import bus_acl


def test_user_names() -> None:
    assert user_name("node-a", "syncloop") == "klet-syncloop@node-a"
    with pytest.raises(ValueError, match="unknown service"):
        user_name("node-a", "kube-proxy")


@pytest.mark.parametrize("node", ["*", "a*", "n1 ~*", "N1", "a?b", "[ab]", ""])
def test_node_names_that_would_widen_a_key_pattern_are_refused(node: str) -> None:
    with pytest.raises(ValueError, match="not a valid node name"):
        service_rules(node, "syncloop")


def test_pod_source_rules() -> None:
    p = "klet:n1:"
    calls = " ".join(f"+fcall|{name}" for name in FUNCTIONS)
    assert service_rules("n1", "pod-source") == [
        "resetkeys",
        "resetchannels",
        "-@all",
        "+ping",
        "+multi",
        "+exec",
        "+discard",
        "+time",
        f"(~{p}desired ~{p}sources +hget +hmget +hgetall +hset +hdel)",
        # The tables' generation counters: read (several in one MGET) and moved.
        f"(~{p}gen:desired ~{p}gen:sources +get +mget)",
        f"(~{p}gen:desired ~{p}gen:sources +incr +incrby +set)",
        f"(~{p}pods ~{p}events:pod-source +xadd)",
        f"(~{p}lease:pod-source ~{p}lease:pod-source:fence "
        "+get +set +pexpire +pttl +del +incr +incrby +exists)",
        f"(~{p}desired ~{p}sources ~{p}gen:desired ~{p}gen:sources ~{p}pods "
        f"~{p}events:pod-source ~{p}lease:pod-source ~{p}lease:pod-source:fence {calls} +type)",
    ]


def test_a_reader_may_read_but_not_move_the_generations_of_tables_it_reads() -> None:
    p = "klet:n1:"
    rules = service_rules("n1", "eviction")
    assert f"(~{p}gen:desired ~{p}gen:status ~{p}gen:node:eviction +get +mget)" in rules
    assert f"(~{p}gen:node:eviction +incr +incrby +set)" in rules


@pytest.mark.parametrize("service", SERVICES)
def test_every_grant_is_on_the_own_node_and_own_lease(service: str) -> None:
    rules = " ".join(service_rules("n1", service))
    keys = [w for w in rules.replace("(", " ").replace(")", " ").split() if w.startswith("~")]
    assert keys and all(k.startswith("~klet:n1:") for k in keys)
    leases = {k for k in keys if ":lease:" in k}
    # No glob: a service may not create lease keys without end.
    assert leases == {f"~klet:n1:lease:{service}", f"~klet:n1:lease:{service}:fence"}
    # The one glob: status-reporter's per-pod histories, each given an expiry as it is
    # written (JOURNAL), so the keys it creates go away by themselves.
    globs = {k for k in keys if "*" in k}
    assert globs == ({"~klet:n1:history:*"} if service == "status-reporter" else set())
    assert "*" not in rules.replace("~klet:n1:history:*", "")


def test_the_history_glob_may_only_append_expire_and_be_read() -> None:
    rules = service_rules("n1", "status-reporter")
    with_glob = [r for r in rules if "~klet:n1:history:*" in r]
    allowed = {"+xadd", "+pexpire", "+xread", "+xrevrange", "+xlen", "+type"}
    for rule in with_glob:
        commands = {w for w in rule.strip("()").split() if w.startswith("+")}
        assert commands <= allowed | {c for c in commands if c.startswith("+fcall|")}, rule


def test_only_pod_source_writes_desired_and_pods() -> None:
    writers = {s for s, a in ACCESS.items() if "desired" in a.writes or "pods" in a.publishes}
    assert writers == {"pod-source"}


def test_every_key_has_one_writer() -> None:
    # A key two services wrote let either forge the other's records (eviction's HSET of
    # syncloop:Ready) or break it for both (an XADD with the largest ID).
    writers: dict[str, set[str]] = {}
    for service, access in ACCESS.items():
        for key in (*access.writes, *access.publishes):
            writers.setdefault(key, set()).add(service)
    assert {k: w for k, w in writers.items() if len(w) > 1} == {}
    assert writers["node:syncloop"] == {"syncloop"} and writers["node:eviction"] == {"eviction"}
    assert {k for k in writers if k.startswith("events:")} == {f"events:{s}" for s in SERVICES}
    # status-reporter reads every service's Events and every condition table.
    assert set(ACCESS["status-reporter"].consumes) == {f"events:{s}" for s in SERVICES}
    assert {"node:syncloop", "node:eviction"} <= set(ACCESS["status-reporter"].reads)


def test_only_status_reporter_tails_the_event_streams() -> None:
    # `klet events` in status-reporter's container reads them with XREAD, without the
    # consumer group; XREAD comes in a selector of its own, without XADD or XACK.
    events = {f"events:{s}" for s in SERVICES}
    tailers = {s for s, a in ACCESS.items() if events & set(a.tails)}
    assert tailers == {"status-reporter"}
    assert events <= set(ACCESS["status-reporter"].tails)
    (selector,) = [
        set(r.strip("()").split())
        for r in service_rules("n1", "status-reporter")
        if {"~klet:n1:events:syncloop", "+xread"} <= set(r.strip("()").split())
    ]
    assert not selector & {"+xadd", "+xack", "+xreadgroup", "+xgroup|create"}


def test_acl_file_holds_hashes_not_passwords() -> None:
    lines = acl_file_lines("admin-pw", {"n1": {s: f"pw-{s}" for s in SERVICES}})
    text = "\n".join(lines)
    assert lines[0] == "user default off"
    assert "admin-pw" not in text and "pw-syncloop" not in text
    assert "#" + hashlib.sha256(b"pw-syncloop").hexdigest() in text
    assert len(lines) == 2 + len(SERVICES)


def test_describe_names_every_service() -> None:
    text = describe()
    assert [line.split(":")[0] for line in text.splitlines()] == list(SERVICES)
    assert "pod-source: reads and writes desired, sources" in text


def test_bus_acl_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secrets_dir = tmp_path / "secrets"
    assert bus_acl(["--node", "n1", "--secrets-dir", str(secrets_dir)]) == 0
    first = capsys.readouterr().out
    files = sorted((secrets_dir / "n1").iterdir())
    assert [f.name for f in files] == sorted(SERVICES)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert f.read_text().strip() not in first
    assert stat.S_IMODE((secrets_dir / "n1").stat().st_mode) == 0o700
    assert "user klet-syncloop@n1 on #" in first
    # A re-run keeps the passwords (services already use them).
    assert bus_acl(["--node", "n1", "--secrets-dir", str(secrets_dir)]) == 0
    assert capsys.readouterr().out == first
    assert bus_acl(["--node", "N*", "--secrets-dir", str(secrets_dir)]) == 2


def test_bus_acl_writes_a_whole_acl_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets_dir, acl_file = tmp_path / "secrets", tmp_path / "bus" / "users.acl"
    argv = ["--node", "n1", "--node", "n2", "--secrets-dir", str(secrets_dir)]
    assert bus_acl([*argv, "--acl-file", str(acl_file)]) == 0
    printed = capsys.readouterr().out
    lines = acl_file.read_text().splitlines()
    assert lines[0] == "user default off"
    # The printed users, without the comment lines redis-server would not accept.
    assert lines[1:] == [line for line in printed.splitlines() if not line.startswith("#")]
    assert len(lines) == 1 + 2 * len(SERVICES)
    assert stat.S_IMODE(acl_file.stat().st_mode) == 0o600
    for f in (secrets_dir / "n2").iterdir():
        assert f.read_text().strip() not in acl_file.read_text()


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_may_run_lua_of_its_own(service: str) -> None:
    words = " ".join(service_rules("n1", service)).replace("(", " ").replace(")", " ").split()
    commands = {w[1:] for w in words if w.startswith("+")}
    for lua in ("eval", "evalsha", "eval_ro", "evalsha_ro", "script", "function", "fcall"):
        assert lua not in commands
    calls = {c.split("|", 1)[1] for c in commands if c.startswith("fcall|")}
    assert calls == set(FUNCTIONS)
    assert all(name.startswith(LIBRARY + "_") for name in calls)


def test_library_names_its_functions() -> None:
    code = library_code()
    assert code.startswith(f"#!lua name={LIBRARY}\n")
    for name in FUNCTIONS:
        assert f"redis.register_function('{name}'," in code


def test_bus_acl_admin_and_functions_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    acl_file, admin, lib = tmp_path / "users.acl", tmp_path / "admin", tmp_path / "lib.lua"
    argv = ["--node", "n1", "--secrets-dir", str(tmp_path / "s"), "--acl-file", str(acl_file)]
    assert bus_acl([*argv, "--admin-password-file", str(admin), "--functions-file", str(lib)]) == 0
    capsys.readouterr()
    password = admin.read_text().strip()
    assert stat.S_IMODE(admin.stat().st_mode) == 0o600
    lines = acl_file.read_text().splitlines()
    assert (
        lines[1]
        == f"user klet-admin on #{hashlib.sha256(password.encode()).hexdigest()} ~* &* +@all"
    )
    assert lib.read_text() == library_code()
    # The admin password is kept on a re-run, as the services' are.
    assert bus_acl([*argv, "--admin-password-file", str(admin)]) == 0
    assert admin.read_text().strip() == password


def test_apply_refuses_a_cleartext_admin_password_off_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "admin").write_text("pw\n")
    argv = ["--node", "n1", "--secrets-dir", str(tmp_path / "s")]
    argv += ["--admin-password-file", str(tmp_path / "admin")]
    assert bus_acl([*argv, "--apply", "redis://10.0.0.9:6379"]) == 2
    assert "not loopback" in capsys.readouterr().err
    assert bus_acl([*argv, "--apply", "redis://u:p@127.0.0.1:6379"]) == 2
    assert "no credentials in the URL" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()

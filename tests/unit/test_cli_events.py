"""`klet events` (klet.cli.events) without Redis: which bus and user it reads as — the
flags, else the KLET_* variables, else `klet up`'s endpoints.json and admin — and which
node (--node, the service user's node, the hostname, else the bus's only node: pick_node);
what it refuses (a password in
--redis-url, one in clear to a remote host, a bad node name, nothing to go on); and
what it prints: the table, "No events found", follow lines aligned with the listing,
the namespace filter, and JSON (a List, or one Event per line when following); text
from the bus (cells, a skipped entry's error, node names) shows control characters
escaped, never raw on the terminal."""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path
from typing import Any, cast

import pytest
from klet.bus.redisbus import Entry
from klet.cli.events import (
    EventReader,
    Printer,
    UsageError,
    _parser,
    bus_access,
    events,
    node_of_user,
    pick_node,
)
from klet.cli.eventview import aggregate
from klet.model.records import BadRecord, EventRecord

T0 = 1_700_000_000.0


def access(argv: list[str], env: dict[str, str] | None = None) -> Any:
    return bus_access(_parser().parse_args(argv), env or {}, hostname=lambda: "My-Host")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "pw"
    path.write_text("s3cret\n")
    return path


def test_flags(secret: Path) -> None:
    a = access(
        [
            "--redis-url",
            "unix:///r/redis.sock",
            "--redis-username",
            "klet-status-reporter@node-a",
            "--redis-password-file",
            str(secret),
        ]
    )
    assert (a.url, a.username, a.password, a.node) == (
        "unix:///r/redis.sock",
        "klet-status-reporter@node-a",
        "s3cret",
        "node-a",
    )
    assert "s3cret" not in repr(a)


def test_variables_as_in_a_service_container(secret: Path) -> None:
    env = {
        "KLET_REDIS_USERNAME": "klet-status-reporter@node-b",
        "KLET_REDIS_PASSWORD_FILE": str(secret),
        "KLET_REDIS_CA_FILE": "/ca.pem",
    }
    a = access([], env)
    # No URL: the services' default socket.
    assert (a.url, a.node, a.password) == ("unix:///run/klet/redis/redis.sock", "node-b", "s3cret")
    assert a.ca_file == Path("/ca.pem")
    # A flag wins over its variable; --node over the user's node.
    b = access(["--redis-username", "klet-syncloop@node-c", "--node", "Other"], env)
    assert (b.username, b.node) == ("klet-syncloop@node-c", "other")


def test_klet_up_run_dir_means_its_admin(tmp_path: Path, secret: Path) -> None:
    (tmp_path / "endpoints.json").write_text(
        json.dumps({"redis_url": "unix:///x.sock", "redis_admin_password_file": str(secret)})
    )
    a = access(["--run-dir", str(tmp_path)])
    assert (a.url, a.username, a.password, a.node) == (
        "unix:///x.sock",
        "klet-admin",
        "s3cret",
        "my-host",
    )
    assert access([], {"KLET_RUN_DIR": str(tmp_path)}).url == "unix:///x.sock"


@pytest.mark.parametrize(
    ("argv", "endpoints", "message"),
    [
        ([], None, "no --redis-url or --redis-username, and no klet up in"),
        ([], {"redis_url": "redis://h:1", "redis_admin_password_file": None}, "Redis of its own"),
        (["--redis-url", "http://x"], None, "must be a redis://, rediss:// or unix:// URL"),
        (["--redis-url", "redis://u:pw@127.0.0.1:6379"], None, "must not contain a password"),
        (
            ["--redis-url", "redis://10.0.0.1:6379", "--redis-password-file", "PW"],
            None,
            "10.0.0.1 is not loopback",
        ),
        (["--redis-username", "u", "--redis-password-file", "/nonexistent"], None, "No such file"),
        (["--redis-username", "u", "--node", "bad_name"], None, "not a valid node name"),
    ],
)
def test_refusals(
    tmp_path: Path, secret: Path, argv: list[str], endpoints: Any, message: str
) -> None:
    if endpoints is not None:
        (tmp_path / "endpoints.json").write_text(json.dumps(endpoints))
    argv = [str(secret) if a == "PW" else a for a in argv]
    with pytest.raises(UsageError, match=message):
        access(["--run-dir", str(tmp_path), *argv])


def test_remote_clear_text_allowed_when_asked(secret: Path) -> None:
    a = access(
        [
            "--redis-url",
            "redis://10.0.0.1:6379",
            "--redis-password-file",
            str(secret),
            "--allow-insecure-redis",
        ]
    )
    assert a.url == "redis://10.0.0.1:6379"


def test_usage_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert events(["--run-dir", str(tmp_path)], env={}) == 2
    assert "klet events: no --redis-url" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("user", "node"),
    [
        ("klet-status-reporter@n1", "n1"),
        ("klet-image-gc@a.b", "a.b"),
        ("klet-admin", ""),
        ("someone@n1", ""),
        ("", ""),
    ],
)
def test_node_of_user(user: str, node: str) -> None:
    assert node_of_user(user) == node


def rec(at: float, reason: str, ns: str = "default", name: str = "web-n1") -> EventRecord:
    return EventRecord(
        type="Warning",
        reason=reason,
        message=f"{reason} happened",
        involved={"kind": "Pod", "namespace": ns, "name": name, "uid": "u"},
        component="kubelet",
        at=at,
    )


def printer(namespace: str | None = None, output: str = "") -> tuple[Printer, io.StringIO]:
    out = io.StringIO()
    return Printer(
        node="n1", namespace=namespace, output=output, out=out, clock=lambda: T0 + 100
    ), out


def test_listing_then_follow_lines_in_the_same_columns() -> None:
    p, out = printer()
    rows = aggregate(
        [
            rec(T0, "Failed"),
            rec(T0 + 10, "Failed"),
            rec(T0 + 40, "BackOff", "kube-system", "dns-n1"),
        ]
    )
    p.listing(rows, follow=True)
    p.event(aggregate([rec(T0 + 100, "Started", name="x")])[0])
    assert out.getvalue().splitlines() == [
        "NAMESPACE     LAST SEEN            TYPE      REASON    OBJECT       MESSAGE",
        "default       90s (x2 over 100s)   Warning   Failed    pod/web-n1   Failed happened",
        "kube-system   60s                  Warning   BackOff   pod/dns-n1   BackOff happened",
        "default       0s                   Warning   Started   pod/x        Started happened",
    ]


def test_namespace_filter_and_nothing_found() -> None:
    p, out = printer("kube-system")
    p.listing(aggregate([rec(T0, "Failed")]), follow=False)
    p.event(aggregate([rec(T0, "Failed")])[0])  # another namespace: not printed
    assert out.getvalue() == "No events found in kube-system namespace.\n"
    p, out = printer()
    p.listing([], follow=False)
    assert out.getvalue() == "No events found.\n"
    p, out = printer("default")
    p.listing([], follow=True)  # following: the header, for the lines to come
    assert out.getvalue() == "LAST SEEN   TYPE   REASON   OBJECT   MESSAGE\n"


def test_json_list_and_json_lines() -> None:
    p, out = printer(output="json")
    p.listing(aggregate([rec(T0, "Failed"), rec(T0 + 1, "Failed")]), follow=False)
    listed = json.loads(out.getvalue())
    assert listed["kind"] == "List"
    assert [(e["reason"], e["count"]) for e in listed["items"]] == [("Failed", 2)]
    p, out = printer(output="json")
    p.listing(aggregate([rec(T0, "Failed")]), follow=True)
    p.event(aggregate([rec(T0, "Pulled")])[0])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["kind"], e["reason"]) for e in lines] == [("Event", "Failed"), ("Event", "Pulled")]


def test_only_the_hostname_is_a_node_not_given(secret: Path) -> None:
    url = ["--redis-url", "redis://127.0.0.1:6379", "--redis-password-file", str(secret)]
    assert not access(url).node_given
    assert access([*url, "--node", "n1"]).node_given
    assert access([*url[:2], "--redis-username", "klet-syncloop@n2"]).node_given


@pytest.mark.parametrize(
    ("present", "picked"),
    [
        ([], "my-host"),  # nothing on the bus yet: the hostname, as the services choose
        (["my-host"], "my-host"),
        (["my-host", "other"], "my-host"),
        (["overridden"], "overridden"),  # klet up --hostname-override
    ],
)
def test_pick_node(present: list[str], picked: str) -> None:
    assert pick_node("my-host", present) == picked


def test_pick_node_refuses_several_others_naming_them() -> None:
    with pytest.raises(UsageError, match="several nodes, none named my-host .*: a, b; give --node"):
        pick_node("my-host", ["a", "b"])


HOSTILE = "\x1b]0;owned\x07\x1b[2J"
"""The reproduced attack: retitle the terminal, then clear it."""


def raw_controls(text: str) -> list[str]:
    return [ch for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")]


def test_listing_and_follow_lines_show_control_characters_escaped() -> None:
    p, out = printer()
    hostile = EventRecord(
        type="Warning",
        reason=f"Failed{HOSTILE}",
        message=f"terminated: {HOSTILE}",
        involved={"kind": "Pod", "namespace": "default", "name": f"w{HOSTILE}", "uid": "u"},
        component="kubelet",
        at=T0,
    )
    p.listing(aggregate([hostile]), follow=True)
    p.event(aggregate([rec(T0 + 1, f"Started{HOSTILE}")])[0])
    text = out.getvalue()
    assert raw_controls(text) == []
    assert "terminated: \\x1b]0;owned\\x07\\x1b[2J" in text
    assert "Started\\x1b]0;owned\\x07\\x1b[2J" in text


class OneBatch:
    """The bus as EventReader reads it: one batch of entries on events:syncloop, then
    nothing (FakeBus's merged stream has no group-less tail)."""

    def __init__(self, entries: list[Entry[EventRecord]]) -> None:
        self.entries = entries

    def stream(self, name: str, record_type: type[EventRecord]) -> str:
        return name

    def merged_stream(self, streams: list[str]) -> OneBatch:
        return self

    def key(self, name: str) -> str:
        return f"klet:n1:{name}"

    async def tail(
        self, after: dict[str, str], *, count: int, block_ms: int | None
    ) -> list[Entry[EventRecord]]:
        batch, self.entries = self.entries, []
        return batch


async def test_a_skipped_entrys_error_is_escaped() -> None:
    fields = json.loads(rec(T0, "Failed").encode())
    raw = json.dumps({**fields, f"x{HOSTILE}": 1}, ensure_ascii=False)
    with pytest.raises(BadRecord) as bad:
        EventRecord.decode(raw)
    entries = [
        Entry("events:syncloop 1-0", None, str(bad.value)),
        Entry("events:syncloop 2-0", rec(T0, "Failed")),
    ]
    reader = EventReader(cast(Any, OneBatch(entries)), warn := io.StringIO())
    assert [r.reason for r in await reader.backlog()] == ["Failed"]
    assert "skipping entry 1-0 of klet:n1:events:syncloop" in warn.getvalue()
    assert "x\\x1b]0;owned" in warn.getvalue()
    assert raw_controls(warn.getvalue()) == []


def test_node_names_from_the_bus_are_escaped() -> None:
    with pytest.raises(UsageError) as err:
        pick_node("my-host", ["a", f"b{HOSTILE}"])
    assert raw_controls(str(err.value)) == []
    assert "b\\x1b]0;owned" in str(err.value)

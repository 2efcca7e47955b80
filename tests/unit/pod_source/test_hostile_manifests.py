"""Hostile manifests are refused while decoding, fast and with bounded memory, each as one
`ManifestError` naming the field: YAML alias bombs and self-referencing aliases, integers
of thousands of digits (Python's int-string conversion limit raises a plain ValueError),
out-of-int64 numbers, lone surrogates, a path-traversing UID or volume name; and ordinary
anchors still work."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from klet.pod_source.manifests import ManifestError, pod_from_file, pods_from_url_body

HEAD = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: nginx:1.25
"""


def alias_bomb(levels: int) -> bytes:
    """A "billion laughs": each level lists the previous one nine times."""
    lines = ['  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for prev, name in zip(names, names[1:levels], strict=False):
        lines.append(f"  {name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    return (HEAD + "  x:\n" + "\n".join("  " + line for line in lines) + "\n").encode()


def refused(data: bytes) -> ManifestError:
    with pytest.raises(ManifestError) as err:
        pod_from_file(data, path="/etc/kubernetes/manifests/x.yaml", node_name="n1")
    return err.value


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    bomb = alias_bomb(7)  # 9**7 = 4.8 million strings once expanded
    assert len(bomb) < 600
    started = time.monotonic()
    err = refused(bomb)
    assert time.monotonic() - started < 1.0
    assert err.reason == "parse" and "aliases expand" in err.message


def test_a_self_referencing_alias_is_refused() -> None:
    err = refused((HEAD + "  x: &loop [*loop]\n").encode())
    assert err.reason == "parse" and "refers to itself" in err.message


def test_anchors_within_reason_still_work() -> None:
    data = textwrap.dedent("""\
        apiVersion: v1
        kind: Pod
        metadata: {name: web}
        spec:
          containers:
          - name: a
            image: busybox
            env: &env [{name: A, value: "1"}, {name: B, value: "2"}]
          - name: b
            image: busybox
            env: *env
        """).encode()
    pod = pod_from_file(data, path="/m/web.yaml", node_name="n1")
    assert pod["spec"]["containers"][1]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "2"},
    ]


def test_a_big_alias_bomb_stays_within_bounded_memory() -> None:
    """~630 bytes that would reach gigabytes: refused by a process limited to 512 MiB."""
    script = textwrap.dedent("""\
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (512 * 2**20, 512 * 2**20))
        from klet.pod_source.manifests import ManifestError, pod_from_file
        data = sys.stdin.buffer.read()
        try:
            pod_from_file(data, path="/m/bomb.yaml", node_name="n1")
        except ManifestError as err:
            print("refused", err.reason)
        """)
    bomb = alias_bomb(9)  # 9**9 = 387 million strings
    assert len(bomb) < 700
    done = subprocess.run(
        [sys.executable, "-c", script], input=bomb, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == "refused parse"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (
            HEAD.replace("spec:\n", "spec:\n  terminationGracePeriodSeconds: " + "9" * 5000 + "\n"),
            "spec.terminationGracePeriodSeconds",
        ),
        (HEAD + "  activeDeadlineSeconds: -" + "1" * 5000 + "\n", "spec.activeDeadlineSeconds"),
        (HEAD + "  priority: 9_223_372_036_854_775_808\n", "spec.priority"),
        (HEAD + "  x: 0x" + "f" * 5000 + "\n", "spec.x"),
        (
            json.dumps({"apiVersion": "v1", "kind": "Pod", "spec": {"y": 1}}).replace(
                "1}", "1" + "0" * 5000 + "}"
            ),
            "spec.y",
        ),
    ],
)
def test_huge_integers_are_a_clean_error_naming_the_field(data: str, field: str) -> None:
    err = refused(data.encode())
    assert err.reason == "parse"
    assert err.message.startswith(f"{field}: integer") and "out of range" in err.message
    assert len(err.message) < 200


def test_a_huge_integer_in_a_url_body_is_a_clean_error() -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "PodList", "items": [{"spec": {"p": 7}}]})
    with pytest.raises(ManifestError) as err:
        pods_from_url_body(body.replace("7", "7" * 5000).encode(), url="http://x/", node_name="n")
    assert err.value.message.startswith("items[0].spec.p: integer")


@pytest.mark.parametrize("data", [b'{"kind": "\\ud800"}', b'kind: "\\ud800"\n'])
def test_lone_surrogates_are_refused(data: bytes) -> None:
    err = refused(data)
    assert err.reason == "parse" and err.message.startswith("kind: string is not valid")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("metadata:\n  name: web\n  uid: ../../../../tmp/x\n", "metadata.uid"),
        ("metadata:\n  name: web\n  uid: a/b\n", "metadata.uid"),
        (None, "spec.volumes[0].name"),
    ],
)
def test_path_components_from_a_manifest_are_refused(change: str | None, field: str) -> None:
    if change is None:
        data = HEAD + "  volumes:\n  - name: ../../..\n    emptyDir: {}\n"
    else:
        data = HEAD.replace("metadata:\n  name: web\n", change)
    err = refused(data.encode())
    assert err.reason == "invalid" and f"{field}: " in err.message


def test_a_valid_manifest_uid_is_kept() -> None:
    data = HEAD.replace("name: web\n", "name: web\n  uid: 0123abcd-ef\n", 1).encode()
    assert pod_from_file(data, path="/m/x", node_name="n1")["metadata"]["uid"] == "0123abcd-ef"


@pytest.mark.parametrize(
    "data",
    [
        b"a: " + b"[" * 30_000 + b"]" * 30_000,  # flow nesting: PyYAML's scanner is quadratic
        b"a: " + b"{x: " * 20_000,
        b"\n".join(b" " * i + b"- a:" for i in range(0, 1000, 2)),  # block nesting
    ],
)
def test_deep_yaml_nesting_is_refused_fast(data: bytes) -> None:
    started = time.monotonic()
    err = refused(data)
    assert time.monotonic() - started < 1.0
    assert err.reason == "parse" and "nested" in err.message

"""Seeded manifest fuzzer: mutated static pods through the file and URL sources.

Each case starts from one of a few valid pods and applies one to three mutations:
wrong types, deleted fields, integers of up to 6,000 digits, deep nesting, bad names,
paths and UIDs, YAML aliases (shared subtrees, bombs, self references), YAML tags,
binary bytes, truncation, flipped characters, duplicate keys, extra documents. It is
written as YAML or JSON and fed through the real code paths:

- even cases: a file in a directory read by the file source's `scan` (what the
  FileSource root task runs), a batch of files per scan;
- odd cases: a body served to `HttpSource.run_once` through httpx's MockTransport (the
  real client and error handling, no network).

A case counts as a crash when an exception escapes the source, or when a rejection
came from the last-resort handler ("cannot decode: <ExceptionType>") rather than a
specific check. A rejection must be clear: a non-empty message of bounded size, tied
to the file (or URL) it came from, and for an invalid pod every problem starting with
the field it concerns. Every accepted pod must also pass the validation syncloop
applies to desired pods, so pod-source never publishes what syncloop would refuse.

Run: `python -m tests.fuzz.manifests --count 10000 --seed 1` (`make fuzz-manifests`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from klet.model.podvalidation import pod_problems
from klet.obs import new_registry
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import create_metrics
from klet.pod_source.sources.files import scan
from klet.pod_source.sources.http import HttpSource

NODE = "fuzz-node"
URL = "http://manifests.fuzz.test/pods"

BASES: list[dict[str, Any]] = [
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "kube-system", "labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "app", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}]
        },
    },
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "full", "annotations": {"a": "b"}},
        "spec": {
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 10,
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db"]}],
            "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "logs", "hostPath": {"path": "/var/log", "type": "Directory"}},
                {
                    "name": "cfg",
                    "configMap": {"name": "cfg", "items": [{"key": "k", "path": "conf/k"}]},
                },
                {
                    "name": "info",
                    "downwardAPI": {
                        "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                    },
                },
            ],
            "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sleep", "3600"],
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {
                        "limits": {"cpu": "500m", "memory": "64Mi"},
                        "requests": {"cpu": "100m"},
                    },
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data", "subPath": "sub"},
                        {"name": "logs", "mountPath": "/logs", "readOnly": True},
                        {"name": "cfg", "mountPath": "/cfg"},
                    ],
                    "livenessProbe": {
                        "httpGet": {"path": "/", "port": 8080},
                        "periodSeconds": 5,
                        "failureThreshold": 3,
                    },
                    "readinessProbe": {"exec": {"command": ["true"]}},
                    "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 1"]}}},
                    "securityContext": {"runAsUser": 1000},
                }
            ],
        },
    },
]

WRONG: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    float("1e308"),
    "x",
    "",
    [],
    {},
    [1, "a", None],
    {"a": {"b": [1]}},
    "../../etc",
    2**63,
    -(2**63) - 1,
    "\u202e\u0000",
]
BAD_NAMES = [
    "../../..",
    "..",
    ".",
    "a/b",
    "/abs",
    "UPPER",
    "-x",
    "x" * 300,
    "name with space",
    "nul\u0000byte",
    "new\nline",
    "é",
    "",
]
BAD_PATHS = ["../x", "a/../../b", "/etc/shadow", "..data", "", "a\u0000b", "x/" * 3000]
BAD_UIDS = ["../../../../tmp/fuzz", "a/b", "..", ".", "", "x" * 200, "-rf", "uid\n"]
NAME_FIELDS = (
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("spec", "containers", 0, "name"),
    ("spec", "volumes", 0, "name"),
    ("spec", "containers", 0, "env", 0, "name"),
    ("spec", "containers", 0, "ports", 0, "name"),
    ("spec", "hostAliases", 0, "hostnames", 0),
)
PATH_FIELDS = (
    ("spec", "containers", 0, "volumeMounts", 0, "subPath"),
    ("spec", "volumes", 1, "hostPath", "path"),
    ("spec", "volumes", 2, "configMap", "items", 0, "path"),
    ("spec", "volumes", 3, "downwardAPI", "items", 0, "path"),
    ("spec", "containers", 0, "volumeMounts", 0, "mountPath"),
)
TAGS = [
    "!!python/object/apply:os.system ['true']",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!float nan",
    "!!int 0x" + "f" * 100,
    "2024-01-01T00:00:00Z",
    "!!omap [a: 1]",
    "!custom x",
]

BIG = "__FUZZ_BIG__"
DEEP = "__FUZZ_DEEP__"


@dataclass
class Case:
    """One mutated manifest and how it was made."""

    index: int
    fmt: str  # "yaml" or "json"
    data: bytes
    mutations: list[str]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> bool:
    """Set `path` in `doc` (creating dicts on the way); False if the way is blocked."""
    target = doc
    for key in path[:-1]:
        if isinstance(target, dict):
            target = target.setdefault(key, {})
        elif isinstance(target, list) and isinstance(key, int) and key < len(target):
            target = target[key]
        else:
            return False
    last = path[-1]
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last < len(target):
        target[last] = value
    else:
        return False
    return True


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    target = doc
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]


class Mutator:
    """Makes cases from a seeded random generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def case(self, index: int) -> Case:
        rng = self.rng
        doc = copy.deepcopy(rng.choice(BASES))
        fmt = rng.choice(("yaml", "json"))
        names: list[str] = []
        text_ops: list[Callable[[str], str]] = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            name, op = self.pick(doc, fmt)
            names.append(name)
            if op is not None:
                text_ops.append(op)
        text = self.dump(doc, fmt, names)
        for op in text_ops:
            text = op(text)
        data = text.encode("utf-8", "surrogatepass")
        if "binary" in names:
            data = self.binary(data)
        return Case(index, fmt, data, names)

    def dump(self, doc: Any, fmt: str, names: list[str]) -> str:
        if fmt == "json":
            text = json.dumps(doc)
        else:
            try:
                text = yaml.safe_dump(doc, sort_keys=False)
            except yaml.YAMLError:
                text = json.dumps(doc)
        big = "".join(self.rng.choice("0123456789") for _ in range(self.rng.randint(20, 6000)))
        sign = self.rng.choice(("", "-"))
        depth = self.rng.choice((50, 500, 5000, 30000))
        text = text.replace(f'"{BIG}"', sign + big).replace(BIG, sign + big)
        text = text.replace(f'"{DEEP}"', "[" * depth + "]" * depth)
        return text.replace(DEEP, "[" * depth + "]" * depth)

    def pick(self, doc: Any, fmt: str) -> tuple[str, Callable[[str], str] | None]:
        rng = self.rng
        paths = _paths(doc) or [("x",)]
        kind = rng.choice(
            [
                "wrong_type",
                "wrong_type",
                "delete",
                "bigint",
                "deep",
                "bad_name",
                "bad_path",
                "bad_uid",
                "alias",
                "self_alias",
                "binary",
                "truncate",
                "flip",
                "tag",
                "multi_doc",
                "dup_key",
                "valid",
            ]
        )
        if kind == "wrong_type":
            _set(doc, rng.choice(paths), copy.deepcopy(rng.choice(WRONG)))
        elif kind == "delete":
            _delete(doc, rng.choice(paths))
        elif kind == "bigint":
            _set(doc, rng.choice(paths), BIG)
        elif kind == "deep":
            _set(doc, rng.choice(paths), DEEP)
        elif kind == "bad_name":
            _set(doc, rng.choice(NAME_FIELDS), rng.choice(BAD_NAMES))
        elif kind == "bad_path":
            _set(doc, rng.choice(PATH_FIELDS), rng.choice(BAD_PATHS))
        elif kind == "bad_uid":
            _set(doc, ("metadata", "uid"), rng.choice(BAD_UIDS))
        elif kind == "alias" and fmt == "yaml":
            return kind, self.alias_op()
        elif kind == "self_alias" and fmt == "yaml":
            return kind, lambda t: t + "loop: &loop [*loop, {a: *loop}]\n"
        elif kind == "truncate":
            return kind, lambda t: t[: rng.randint(0, max(0, len(t) - 1))]
        elif kind == "flip":
            return kind, self.flip_op()
        elif kind == "tag" and fmt == "yaml":
            return kind, lambda t: t + f"extra: {rng.choice(TAGS)}\n"
        elif kind == "multi_doc":
            return kind, lambda t: t + "\n---\n" + t
        elif kind == "dup_key":
            return kind, lambda t: t.replace('"metadata"', '"metadata": {}, "metadata"', 1).replace(
                "metadata:", "metadata: {}\nmetadata:", 1
            )
        return kind, None

    def alias_op(self) -> Callable[[str], str]:
        rng = self.rng
        levels = rng.randint(2, 10)
        width = rng.randint(2, 12)
        lines = ["  l0: &l0 [" + ",".join(['"lol"'] * width) + "]"]
        for level in range(1, levels):
            refs = ",".join([f"*l{level - 1}"] * width)
            lines.append(f"  l{level}: &l{level} [{refs}]")
        block = "bomb:\n" + "\n".join(lines) + "\n"
        return lambda t: t + block

    def flip_op(self) -> Callable[[str], str]:
        rng = self.rng

        def flip(text: str) -> str:
            chars = list(text)
            for _ in range(rng.randint(1, 8)):
                if chars:
                    chars[rng.randrange(len(chars))] = rng.choice(
                        "{}[]:-&*!|>'\"\t\n#%@`\\\x00\x7f"
                    )
            return "".join(chars)

        return flip

    def binary(self, data: bytes) -> bytes:
        rng = self.rng
        noise = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
        if rng.random() < 0.5:
            return noise
        at = rng.randint(0, len(data))
        return data[:at] + noise + data[at:]


@dataclass
class Outcome:
    """What the run saw."""

    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    unclear: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")

    def accept(self, pods: list[Any], where: str) -> None:
        self.accepted += 1
        for pod in pods:
            problems = pod_problems(pod, require_uid=True)
            if problems:
                self.inconsistent.append(f"{where}: syncloop would refuse: {problems[0]}")

    def reject(self, reason: str, message: str, where: str) -> None:
        self.rejected[reason] += 1
        if message.startswith("cannot decode:") or re.match(r"^[A-Z]\w+Error: ", message):
            self.crashes.append(f"{where}: {message[:300]}")
        elif not _clear(reason, message):
            self.unclear.append(f"{where}: {reason}: {message[:300]}")

    def timed(self, seconds: float, where: str) -> None:
        if seconds > self.slowest[0]:
            self.slowest = (seconds, where)


FIELD_START = re.compile(
    r"^(items\[\d+\]\.)?(apiVersion|kind|metadata|spec|<root>)(?=[.\[:]).*?: \S", re.S
)


def _clear(reason: str, message: str) -> bool:
    if not message or len(message) > 20_000:
        return False
    if reason == "invalid":
        # Each problem starts with its field path (map keys inside it may hold anything).
        return all(re.match(FIELD_START, part) for part in message.split("; "))
    return True


def run_file_cases(cases: list[Case], outcome: Outcome, root: Path) -> None:
    """Write `cases` into one directory and read it with the file source's scan."""
    directory = Path(tempfile.mkdtemp(dir=root))
    where: dict[str, Case] = {}
    for case in cases:
        path = directory / f"case-{case.index:05d}.{case.fmt}"
        path.write_bytes(case.data)
        where[str(path)] = case
    started = time.monotonic()
    try:
        result = scan(directory, node_name=NODE)
    except Exception as err:  # noqa: BLE001 - counted, the run goes on
        outcome.crashes.append(f"scan of {directory}: {type(err).__name__}: {err}")
        return
    outcome.timed(time.monotonic() - started, f"file batch {directory.name}")
    for path, bad in result.bad.items():
        if bad.path != path or path not in where:
            outcome.unclear.append(f"{path}: rejection does not name its file")
            continue
        outcome.reject(bad.reason, bad.message, f"{path} {where[path].mutations}")
    # Every file not refused became one pod (an empty file is refused too).
    outcome.accepted += len([path for path in where if path not in result.bad])
    for pod in result.pods:
        problems = pod_problems(pod, require_uid=True)
        if problems:
            outcome.inconsistent.append(f"file pod {pod['metadata'].get('name')}: {problems[0]}")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def run_url_cases(cases: list[Case], outcome: Outcome) -> None:
    """Serve each case as the manifest URL's body to a real HttpSource, one poll each."""
    body = b""

    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    capture = _Capture()
    logger = logging.getLogger("klet.pod_source.sources.http")
    logger.addHandler(capture)
    try:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            for case in cases:
                inbox = Inbox()
                source = HttpSource(
                    url=URL,
                    headers={},
                    node_name=NODE,
                    period_s=60,
                    inbox=inbox,
                    metrics=create_metrics(new_registry()),
                )
                body = case.data
                capture.records.clear()
                where = f"case {case.index} ({case.fmt}, {case.mutations})"
                started = time.monotonic()
                try:
                    await source.run_once(client)
                except Exception as err:  # noqa: BLE001 - counted, the run goes on
                    outcome.crashes.append(f"{where}: {type(err).__name__}: {err}")
                    continue
                outcome.timed(time.monotonic() - started, where)
                pending, _ = inbox.take()
                if "http" in pending:
                    outcome.accept(pending["http"], where)
                    continue
                refused = [r for r in capture.records if "refused" in r.getMessage()]
                if len(refused) != 1 or URL not in refused[0].getMessage():
                    outcome.unclear.append(f"{where}: no single refusal naming the URL")
                    continue
                record = refused[0]
                outcome.reject(
                    str(getattr(record, "reason", "")), str(getattr(record, "error", "")), where
                )
    finally:
        logger.removeHandler(capture)


def run(count: int, seed: int, *, batch: int = 200) -> tuple[Outcome, float]:
    """Fuzz `count` cases from `seed`; the outcome and the seconds it took."""
    mutator = Mutator(seed)
    cases = [mutator.case(i) for i in range(count)]
    outcome = Outcome()
    started = time.monotonic()
    logging.getLogger("klet.pod_source").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="klet-fuzz-") as root:
        file_cases = [c for c in cases if c.index % 2 == 0]
        for i in range(0, len(file_cases), batch):
            run_file_cases(file_cases[i : i + batch], outcome, Path(root))
    asyncio.run(run_url_cases([c for c in cases if c.index % 2 == 1], outcome))
    return outcome, time.monotonic() - started


def report(outcome: Outcome, seconds: float, count: int) -> str:
    rejected = sum(outcome.rejected.values())
    lines = [
        f"manifests fuzzed: {count} (seeded), {seconds:.1f}s",
        f"accepted: {outcome.accepted}, rejected: {rejected} {dict(outcome.rejected)}",
        f"crashes: {len(outcome.crashes)}, unclear errors: {len(outcome.unclear)}, "
        f"accepted but refused by syncloop: {len(outcome.inconsistent)}",
        f"slowest: {outcome.slowest[0]:.2f}s ({outcome.slowest[1][:120]})",
    ]
    for title, items in (
        ("crash", outcome.crashes),
        ("unclear", outcome.unclear),
        ("inconsistent", outcome.inconsistent),
    ):
        lines += [f"  {title}: {item}" for item in items[:20]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    outcome, seconds = run(args.count, args.seed)
    print(report(outcome, seconds, args.count))
    bad = outcome.crashes or outcome.unclear or outcome.inconsistent
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

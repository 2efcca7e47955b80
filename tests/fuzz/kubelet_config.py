"""A seeded fuzzer of klet's configuration loading: mutated KubeletConfiguration files
and mutated command lines fed to `load_settings`, the one function every service starts
with.

Each case is a file (YAML or JSON text: wrong types, huge and negative numbers, unknown
fields, nested garbage, deep nesting, anchors and aliases, duplicate keys, flipped bytes,
truncation, binary junk) plus a flag set (every known flag with plausible, invalid and
hostile values, repeats, unknown flags, stray arguments) and sometimes KLET_* variables.
The oracle: `load_settings` returns Settings or raises ConfigError whose every problem
names the file (and, past a file-level error, the field) or the flag or variable.
Anything else (another exception, a problem naming nothing, a case slower than a
second) is a crash.

The generator is our own and driven by `random.Random(seed)`, so a failing case is
reproduced from its seed and index alone (`--seed S --only N` prints it). The unit tests
run a short subset; `make fuzz` runs 10,000 of each and prints the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from klet.config import FLAGS, ConfigError, KubeletConfiguration, load_settings
from klet.config.kubelet import nested_class

SLOW_S = 1.0

# A valid base: every case starts from it, so mutations reach deep into validation.
BASE: dict[str, Any] = {
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "kind": "KubeletConfiguration",
    "staticPodPath": "manifests",
    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"},
    "evictionSoft": {"memory.available": "200Mi"},
    "evictionSoftGracePeriod": {"memory.available": "1m"},
    "authentication": {"anonymous": {"enabled": False}, "webhook": {"cacheTTL": "2m"}},
    "authorization": {"mode": "AlwaysAllow"},
    "clusterDNS": ["10.0.0.10"],
    "clusterDomain": "cluster.local",
    "registerWithTaints": [{"key": "a", "effect": "NoSchedule"}],
    "kubeReserved": {"cpu": "100m", "memory": "100Mi"},
    "featureGates": {"KubeletFineGrainedAuthz": True},
    "logging": {"verbosity": 2, "options": {"json": {"infoBufferSize": "0"}}},
    "crashLoopBackOff": {"maxContainerRestartPeriod": "10s"},
    "podPidsLimit": 1024,
    "maxPods": 50,
    "syncFrequency": "30s",
}

SCALARS: list[Any] = [
    0,
    -1,
    1,
    7,
    2**31,
    2**63,
    -(2**63) - 1,
    10**30,
    1.5,
    -0.0,
    float("inf"),
    float("nan"),
    True,
    False,
    None,
    "",
    " ",
    "0",
    "-1",
    "10Mi",
    "-10Mi",
    "1e400",
    "5%",
    "101%",
    "%",
    "1h",
    "-1s",
    "9999999999h",
    "1.5.5s",
    "systemd",
    "none",
    "static",
    "Webhook",
    "unix:///run/x.sock",
    "tcp://[::1",
    "http://",
    "..",
    "../../etc/passwd",
    "/",
    "a" * 5000,
    "\u0000",
    "\ud7ff\u202e",
    "ключ",
    "yes",
    "~",
    "0x1F",
    "1_000",
    "memory.available<1Gi",
]


def _leaf_paths(cls: type[Any] = KubeletConfiguration, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        path = prefix + f.metadata["json"]
        if f.metadata["kind"] == "nested":
            out += _leaf_paths(nested_class(f), path + ".")
        out.append(path)
    return out


FIELD_PATHS = _leaf_paths()


def garbage(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON-like value, sometimes nested."""
    roll = rng.random()
    if depth > 3 or roll < 0.6:
        return rng.choice(SCALARS)
    if roll < 0.8:
        return [garbage(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = [rng.choice(FIELD_PATHS).split(".")[-1], rng.choice(SCALARS), "x"]
    return {str(rng.choice(keys)): garbage(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def deep(rng: random.Random) -> Any:
    value: Any = rng.choice(SCALARS)
    for _ in range(rng.choice((50, 500, 5000))):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = doc
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def mutate_doc(rng: random.Random) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.55:
            _set(doc, rng.choice(FIELD_PATHS), garbage(rng))
        elif op < 0.65:
            _set(doc, rng.choice(["unknownField", "authentication.x509.extra", "a.b.c"]), 1)
        elif op < 0.72:
            doc.pop(rng.choice(["apiVersion", "kind"]), None)
        elif op < 0.78:
            doc[rng.choice(["apiVersion", "kind"])] = garbage(rng)
        elif op < 0.84:
            _set(doc, rng.choice(FIELD_PATHS), deep(rng))
        else:
            _set(doc, rng.choice(FIELD_PATHS), rng.choice(SCALARS))
    return doc


def _yaml_text(rng: random.Random, doc: Any) -> str:
    try:
        text = yaml.safe_dump(doc, allow_unicode=rng.random() < 0.5)
    except (yaml.YAMLError, RecursionError):
        return "{}"
    return text


def alias_bomb(rng: random.Random) -> str:
    width = rng.choice((5, 9))
    lines = ["apiVersion: kubelet.config.k8s.io/v1beta1", "kind: KubeletConfiguration"]
    lines.append('a0: &a0 ["lol", "lol", "lol"]')
    for i in range(1, rng.choice((4, 8, 12))):
        refs = ", ".join(f"*a{i - 1}" for _ in range(width))
        lines.append(f"a{i}: &a{i} [{refs}]")
    field = rng.choice(
        ["logging: {options: {x: *LAST}}", "registerWithTaints: *LAST", "clusterDNS: *LAST"]
    )
    last = f"a{len(lines) - 3}"
    lines = [*lines[:2], "x-anchors: &holder", *("  " + line for line in lines[2:])]
    # the anchors live under an unknown field; the chosen field refers to the last one
    lines.append(field.replace("LAST", last))
    return "\n".join(lines) + "\n"


def render(rng: random.Random, doc: dict[str, Any]) -> tuple[str, bytes]:
    """(file suffix, file content) for `doc`, sometimes damaged."""
    roll = rng.random()
    if roll < 0.05:
        return ".yaml", alias_bomb(rng).encode()
    if roll < 0.08:
        return rng.choice((".yaml", ".json")), rng.randbytes(rng.randint(0, 300))
    if roll < 0.10:
        return ".yaml", b""
    if roll < 0.14:  # nesting written out, since the serializers refuse to go this deep
        n = rng.choice((60, 70, 200, 1000, 100_000))
        field = rng.choice(FIELD_PATHS).split(".")[0]
        head = '{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"'
        inner = rng.choice((("[" * n, "]" * n), ('{"a": ' * n + "1", "}" * n)))
        return rng.choice((".json", ".yaml")), f'{head}, "{field}": {"".join(inner)}}}'.encode()
    if roll < 0.16:
        text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        return ".yaml", (text + "clusterDNS: &a [*a]\n").encode()
    if roll < 0.45:
        try:
            text = json.dumps(doc, allow_nan=True)
        except (ValueError, RecursionError):
            text = "{}"
        suffix = ".json"
    else:
        text = _yaml_text(rng, doc)
        suffix = ".yaml"
    data = text.encode()
    damage = rng.random()
    if damage < 0.08 and data:
        cut = rng.randint(0, len(data))
        data = data[:cut]
    elif damage < 0.16 and data:
        buf = bytearray(data)
        for _ in range(rng.randint(1, 5)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        data = bytes(buf)
    elif damage < 0.20 and suffix == ".yaml":
        data += b"maxPods: 3\nmaxPods: 4\n"  # duplicate key
    elif damage < 0.23 and suffix == ".yaml":
        data = b"!!python/object/apply:os.system ['true']\n" + data
    return suffix, data


FLAG_VALUES: list[str] = [
    "",
    "0",
    "-1",
    "1",
    "true",
    "false",
    "maybe",
    "10250",
    "65536",
    "99999999999999999999999",
    "9" * 5000,
    "1h",
    "-5s",
    "x",
    "a=b",
    "a=b,c",
    "=",
    ",",
    "memory.available<1Gi",
    "memory.available<",
    "nodefs.available<101%",
    "a:b",
    ":",
    "10.0.0.1",
    "::1,10.0.0.1",
    "300.1.1.1",
    "/tmp",
    "unix:///x.sock",
    "redis://",
    "redis://[x",
    "tcp://[::1",
    "tcp://h:99999",
    "ftp://x",
    "systemd",
    "pods,system-reserved",
    "\u202e",
    "-",
    "--",
]


def mutate_argv(rng: random.Random, config: Path | None) -> list[str]:
    argv: list[str] = []
    if config is not None:
        argv += ["--config", str(config)]
    for _ in range(rng.randint(0, 6)):
        roll = rng.random()
        spec = rng.choice(FLAGS)
        value = rng.choice(FLAG_VALUES)
        if roll < 0.6:
            argv += [spec.flag, value]
        elif roll < 0.75:
            argv.append(f"{spec.flag}={value}")
        elif roll < 0.8:
            argv.append(spec.flag.replace("-", "_").replace("__", "--"))
            argv.append(value)
        elif roll < 0.85:
            argv.append(spec.flag)  # possibly missing its value
        elif roll < 0.9:
            argv += ["--no-such-flag", value]
        elif roll < 0.95:
            argv.append(value or "stray")
        else:
            argv += ["-v", value]
    return argv


def mutate_env(rng: random.Random) -> dict[str, str]:
    env: dict[str, str] = {}
    for spec in FLAGS:
        if spec.env and rng.random() < 0.1:
            env[spec.env] = rng.choice(FLAG_VALUES)
    return env


_FLAG = re.compile(r"^(--[a-z][a-z0-9-]*|-v|KLET_[A-Z_]+)(: |$)")
_ARGPARSE = re.compile(r"argument (--[a-z][a-z0-9_-]*|-v)")
_FILE_LEVEL = (
    "cannot read",
    "not UTF-8 text",
    "the file is empty",
    "cannot parse",
    "the file must hold",
    "too large",
    "line ",
    "duplicate field",
)
_FIELD = re.compile(r"^\S.*?: ")  # a field path as the file spelled it, then the message


def unnamed(problem: str, configs: list[str]) -> bool:
    """Whether `problem` fails to name the file and field, or the flag or variable."""
    for config in configs:
        if problem.startswith(f"{config}: "):
            rest = problem[len(f"{config}: ") :]
            return not (rest.startswith(_FILE_LEVEL) or _FIELD.match(rest))
    if _FLAG.match(problem) or problem.startswith(("unknown flag: ", "unexpected argument: ")):
        return False
    return not _ARGPARSE.search(problem)


@dataclasses.dataclass
class Report:
    cases: int = 0
    accepted: int = 0
    rejected: int = 0
    crashes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.cases} cases, {self.accepted} accepted, {self.rejected} "
            f"rejected with a ConfigError, {len(self.crashes)} crashes, {self.seconds:.1f}s"
        )


def run_case(argv: list[str], env: dict[str, str], slow_s: float = SLOW_S) -> str | None:
    """None when the case was accepted, "" when refused naming file/field or flag; else
    a description of the crash."""
    # any --config value may be the file a problem names (the last one wins)
    configs = [b for a, b in zip(argv, argv[1:], strict=False) if a == "--config"]
    configs += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    configs += [str(Path(c)) for c in configs if c]  # as Path spells it: "a//b" -> "a/b"
    start = time.monotonic()
    try:
        load_settings(argv, env=env, service="syncloop", hostname="node-1")
    except ConfigError as err:
        bad = [p for p in err.problems if unnamed(p, configs)]
        if not err.problems or bad:
            return f"problem names no file, field or flag: {bad or err.problems}"
        outcome = "rejected"
    except Exception as err:  # noqa: BLE001 - the crash the fuzzer looks for
        return f"{type(err).__name__}: {str(err)[:300]}"
    else:
        outcome = "accepted"
    elapsed = time.monotonic() - start
    if elapsed > slow_s:
        return f"slow: {elapsed:.2f}s ({outcome})"
    return None if outcome == "accepted" else ""


def fuzz_files(
    count: int, seed: int, workdir: Path, only: int | None = None, *, slow_s: float = SLOW_S
) -> Report:
    """`count` mutated configuration files, each loaded with a plain command line."""
    return _fuzz(count, seed, workdir, only, files=True, slow_s=slow_s)


def fuzz_flags(
    count: int, seed: int, workdir: Path, only: int | None = None, *, slow_s: float = SLOW_S
) -> Report:
    """`count` mutated flag sets (a third of them over a valid file) with KLET_* values."""
    return _fuzz(count, seed, workdir, only, files=False, slow_s=slow_s)


def _fuzz(
    count: int, seed: int, workdir: Path, only: int | None, *, files: bool, slow_s: float
) -> Report:
    report = Report()
    started = time.monotonic()
    base_file = workdir / "base.json"
    base_file.write_text(json.dumps(BASE))
    (workdir / "manifests").mkdir(exist_ok=True)
    for i in range(count):
        if only is not None and i != only:
            continue
        rng = random.Random(f"{seed}:{'files' if files else 'flags'}:{i}")
        env: dict[str, str] = {}
        if files:
            suffix, data = render(rng, mutate_doc(rng))
            config: Path | None = workdir / f"case{i % 50}{suffix}"
            assert config is not None
            config.write_bytes(data)
            argv = ["--config", str(config)]
        else:
            config = base_file if rng.random() < 0.33 else None
            argv = mutate_argv(rng, config)
            env = mutate_env(rng)
        if only is not None:
            print(f"argv={argv!r} env={env!r}")
            if files and config is not None:
                print(config.read_bytes()[:2000])
        report.cases += 1
        result = run_case(argv, env, slow_s)
        if result is None:
            report.accepted += 1
        elif result == "":
            report.rejected += 1
        else:
            report.crashes.append(f"case {i}: {result}")
    report.seconds = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, help="run (and print) one case of each kind")
    args = parser.parse_args(argv)
    crashes = 0
    with tempfile.TemporaryDirectory(prefix="klet-fuzz-") as tmp:
        for what, fn in (("config files", fuzz_files), ("flag sets", fuzz_flags)):
            workdir = Path(tmp) / what.replace(" ", "-")
            workdir.mkdir()
            report: Report = fn(args.count, args.seed, workdir, args.only)
            print(report.line(what))
            for crash in report.crashes[:20]:
                print("  " + crash)
            crashes += len(report.crashes)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())

"""Strict decoding of a KubeletConfiguration file, collecting every problem at once.

Upstream decodes the file strictly (unknown or duplicate fields are errors), applies
SetDefaults_KubeletConfiguration, resolves relative paths against the file's directory
and validates. klet does the same, except that it does not stop at the first problem:
an operator fixing a config file wants the whole list, each entry naming the file and
the field path (`kubelet.yaml: evictionHard.memory.available: invalid quantity "10Zz"`).

The decoder is driven by the dataclass field metadata declared in kubelet.py, so adding
a field there is enough for it to load, default, validate and serialize.

Trade-off: YAML is read with PyYAML's safe loader (YAML 1.1, like upstream's go-yaml v2),
so `yes`/`no` are booleans in both; JSON files are read with the json module.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from klet.config.errors import ConfigError, Problem
from klet.config.kubelet import (
    API_VERSION,
    DEFAULT_EVICTION_HARD,
    KIND,
    KubeletConfiguration,
    nested_class,
)
from klet.config.shape import shape_problem, show
from klet.config.validation import validate_problems
from klet.model.units import parse_duration

__all__ = [
    "ConfigError",
    "Problem",
    "decode_config",
    "load_config_file",
    "read_config_data",
    "read_config_file",
]


_INVALID = object()  # a decoder's "value rejected, problem recorded"
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Decoder:
    def __init__(self, base_dir: Path | None) -> None:
        self.base_dir = base_dir
        self.problems: list[Problem] = []
        self.given: set[str] = set()  # upstream dotted paths the file set (decoded)

    def bad(self, path: str, message: str) -> object:
        self.problems.append(Problem(path, message))
        return _INVALID

    # --- scalars -----------------------------------------------------------------------
    def scalar(self, kind: str, raw: object, path: str) -> object:
        if kind == "str":
            return (
                raw
                if isinstance(raw, str)
                else self.bad(path, f"must be a string, got {show(raw)}")
            )
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            return self.bad(path, f"must be a boolean, got {show(raw)}")
        if kind in _INT_RANGES:
            if isinstance(raw, bool) or not isinstance(raw, int):
                return self.bad(path, f"must be an integer, got {show(raw)}")
            low, high = _INT_RANGES[kind]
            if not low <= raw <= high:
                return self.bad(path, f"{raw} is out of range for {kind}")
            return raw
        if kind == "float":
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                return self.bad(path, f"must be a number, got {show(raw)}")
            if not math.isfinite(raw):
                return self.bad(path, f"must be a finite number, got {show(raw)}")
            return float(raw)
        if kind == "duration":
            return self.duration(raw, path)
        if kind == "duration_or_ns":
            if isinstance(raw, int) and not isinstance(raw, bool):
                return raw / 1e9
            return self.duration(raw, path)
        raise AssertionError(f"unknown kind {kind}")  # pragma: no cover

    def duration(self, raw: object, path: str) -> object:
        if not isinstance(raw, str):
            return self.bad(path, f'invalid duration {show(raw)}: must be a string like "1m30s"')
        try:
            return parse_duration(raw)
        except ValueError as exc:
            return self.bad(path, str(exc))

    # --- containers ------------------------------------------------------------------------
    def mapping(self, raw: object, path: str, value: Callable[[object, str], object]) -> object:
        if not isinstance(raw, Mapping):
            return self.bad(path, f"must be an object, got {show(raw)}")
        out: dict[str, object] = {}
        for key, item in raw.items():
            if not isinstance(key, str):
                self.bad(path, f"key {show(key)} must be a string")
                continue
            decoded = value(item, _join(path, key))
            if decoded is not _INVALID:
                out[key] = decoded
        return out

    def sequence(self, raw: object, path: str, item: Callable[[object, str], object]) -> object:
        if not isinstance(raw, list):
            return self.bad(path, f"must be a list, got {show(raw)}")
        out = [item(v, f"{path}[{i}]") for i, v in enumerate(raw)]
        return _INVALID if any(v is _INVALID for v in out) else tuple(out)

    def value(self, f: dataclasses.Field[Any], raw: object, path: str) -> object:
        kind: str = f.metadata["kind"]
        if kind == "nested":
            return self.struct(nested_class(f), raw, path)[0]
        if kind == "str_list":
            return self.sequence(raw, path, lambda v, p: self.scalar("str", v, p))
        if kind == "str_map":
            return self.mapping(raw, path, lambda v, p: self.scalar("str", v, p))
        if kind == "bool_map":
            return self.mapping(raw, path, lambda v, p: self.scalar("bool", v, p))
        if kind == "duration_map":
            return self.mapping(raw, path, self.duration)
        if kind == "str_list_map":
            return self.mapping(
                raw, path, lambda v, p: self.sequence(v, p, lambda s, q: self.scalar("str", s, q))
            )
        if kind == "object":
            return dict(raw) if isinstance(raw, Mapping) else self.bad(path, "must be an object")
        if kind == "object_list":
            return self.sequence(
                raw,
                path,
                lambda v, p: (
                    dict(v) if isinstance(v, Mapping) else self.bad(p, "must be an object")
                ),
            )
        decoded = self.scalar(kind, raw, path)
        if f.metadata["path_ref"] and isinstance(decoded, str):
            decoded = self.resolve(decoded)
        return decoded

    def resolve(self, value: str) -> str:
        """A relative path in the file is relative to the file's directory, as upstream."""
        if value and self.base_dir is not None and not Path(value).is_absolute():
            return str(self.base_dir / value)
        return value

    def struct(self, cls: type[Any], raw: object, path: str) -> tuple[Any, dict[str, Any]]:
        """Decode an object into `cls`; also returns the fields the file actually set."""
        if not isinstance(raw, Mapping):
            self.bad(path, f"must be an object, got {show(raw)}")
            return cls(), {}
        by_json = {f.metadata["json"]: f for f in dataclasses.fields(cls)}
        given: dict[str, Any] = {}
        for key, item in raw.items():
            key_path = _join(path, str(key))
            f = by_json.get(key) if isinstance(key, str) else None
            if f is None:
                self.bad(key_path, "unknown field")
                continue
            if item is None:  # null is "not set", as for Go pointers and zero values
                continue
            decoded = self.value(f, item, key_path)
            if decoded is _INVALID:
                continue
            if f.metadata["zero_unset"] and not decoded:
                continue
            given[f.name] = decoded
            self.given.add(key_path)
        return cls(**given), given


def decode_config(
    data: object, *, base_dir: Path | None = None, given: set[str] | None = None
) -> tuple[KubeletConfiguration, list[Problem]]:
    """Decode a parsed file (dict) strictly and apply upstream's defaulting.

    Returns the configuration (fields with problems keep their defaults) and the type
    problems; value checks are `validate()`'s. `given`, when passed, receives the upstream
    dotted path of every field the file set (`logging.format`): what a klet-only setting
    that falls back to a file field needs to tell "set to the default" from "not set".
    """
    decoder = _Decoder(base_dir)
    if not isinstance(data, Mapping):
        decoder.bad("", f"the file must hold a {KIND} object, got {show(data)}")
        return KubeletConfiguration(), decoder.problems
    body = dict(data)
    api_version = body.pop("apiVersion", None)
    kind = body.pop("kind", None)
    if api_version != API_VERSION:
        got = "missing" if api_version is None else f"got {show(api_version)}"
        decoder.bad("apiVersion", f'must be "{API_VERSION}" ({got})')
    if kind != KIND:
        got = "missing" if kind is None else f"got {show(kind)}"
        decoder.bad("kind", f'must be "{KIND}" ({got})')
    cfg, fields = decoder.struct(KubeletConfiguration, body, "")
    if given is not None:
        given.update(decoder.given)
    return _apply_defaults(cfg, fields), decoder.problems


def _apply_defaults(cfg: KubeletConfiguration, given: Mapping[str, Any]) -> KubeletConfiguration:
    """The parts of SetDefaults_KubeletConfiguration that depend on other fields."""
    changes: dict[str, Any] = {}
    if "node_status_report_frequency" not in given and "node_status_update_frequency" in given:
        changes["node_status_report_frequency"] = cfg.node_status_update_frequency
    if "serialize_image_pulls" not in given:
        parallel = cfg.max_parallel_image_pulls
        changes["serialize_image_pulls"] = parallel is None or parallel < 2
    if cfg.pod_pids_limit < 0:
        changes["pod_pids_limit"] = -1
    if "eviction_hard" in given and cfg.merge_default_eviction_settings:
        changes["eviction_hard"] = {**DEFAULT_EVICTION_HARD, **cfg.eviction_hard}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _parse_text(text: str, *, json_file: bool) -> tuple[object, list[str]]:
    if json_file:
        duplicates: list[str] = []

        def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, value in items:
                if key in out:
                    duplicates.append(f"duplicate field {show(key)}")
                out[key] = value
            return out

        return json.loads(text, object_pairs_hook=pairs), duplicates
    # PyYAML is imported only when a YAML file is read: most services start without
    # --config, and it costs each of them about 1 MB resident (issue 15).
    from klet.config.yamltext import parse_yaml

    return parse_yaml(text)


def read_config_file(
    path: Path | str, *, given: set[str] | None = None
) -> tuple[KubeletConfiguration, list[Problem]]:
    """Read and decode a file without validating it; problems are unprefixed.

    Syntax and I/O errors come back as problems with an empty path. `given`: as for
    `decode_config`.
    """
    file = Path(path)
    data, problems = read_config_data(file)
    if data is None:
        return KubeletConfiguration(), problems
    cfg, decode_problems = decode_config(data, base_dir=file.parent.absolute(), given=given)
    return cfg, problems + decode_problems


def read_config_data(file: Path) -> tuple[object | None, list[Problem]]:
    """Read and parse a file (YAML, or JSON by its suffix) without decoding it: the data
    (None when it cannot be read or parsed) and its problems, unprefixed (duplicate
    fields are problems beside the data)."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [Problem("", f"cannot read: {exc.strerror or exc}")]
    except UnicodeDecodeError:
        return None, [Problem("", "not UTF-8 text")]
    if not text.strip():
        return None, [Problem("", "the file is empty")]
    try:
        data, duplicates = _parse_text(text, json_file=file.suffix.lower() == ".json")
    except ValueError as exc:  # klet.config.yamltext turns YAMLError into ValueError
        detail = " ".join(str(exc).split())
        return None, [Problem("", f"cannot parse: {detail}")]
    except RecursionError:
        return None, [Problem("", "cannot parse: nested too deeply")]
    shape = shape_problem(data)
    if shape is not None:
        return None, [Problem("", f"cannot parse: {shape}")]
    return data, [Problem("", d) for d in duplicates]


def load_config_file(path: Path | str) -> KubeletConfiguration:
    """Load, default and validate a KubeletConfiguration file (YAML or JSON).

    Raises ConfigError listing every problem, each as `<file>: <field path>: <message>`.
    """
    cfg, problems = read_config_file(path)
    # Fields that failed to decode kept their defaults, so validating adds no noise.
    problems += validate_problems(cfg)
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return cfg

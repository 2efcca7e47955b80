"""`--config-dir`: KubeletConfiguration drop-ins merged over the `--config` file, as
upstream's kubelet v1.34 merges them (cmd/kubelet/app/server.go,
mergeKubeletConfigurations).

Upstream's order and rules, which klet follows:

- every file ending in `.conf` under the directory, subdirectories included, in the
  order a lexical depth-first walk meets them (Go's filepath.WalkDir: `10-a.conf`, then
  `20-b/…`, then `30-c.conf`); other files are not read;
- each must be a whole `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration` (apiVersion
  and kind), decoded as strictly as the main file: an unknown field, a wrong type or a
  duplicate field is refused, naming the drop-in;
- each is a JSON merge patch (RFC 7386) over the configuration so far, in its upstream
  JSON form *after* defaulting: objects merge key by key (a drop-in's `evictionHard:
  {memory.available: 200Mi}` keeps the other defaulted thresholds), lists and scalars
  replace, `null` removes (the field then takes its default again);
- the merged result is decoded and defaulted again; command-line flags still win over
  it, and relative paths in a drop-in are not resolved against any directory (upstream
  resolves only the main file's).

The merge patch is the ten lines of RFC 7386 written here rather than a dependency: the
PyPI packages that implement it are unmaintained single-function modules, and the RFC's
algorithm is complete as written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from klet.config.decoding import decode_config, read_config_data
from klet.config.errors import Problem
from klet.config.kubelet import KubeletConfiguration

__all__ = ["DROP_IN_SUFFIX", "DropIns", "apply_drop_ins", "drop_in_files", "merge_patch"]

DROP_IN_SUFFIX = ".conf"


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386: `patch` applied to `target` (neither is modified)."""
    if not isinstance(patch, Mapping):
        return patch
    out: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def drop_in_files(directory: Path) -> list[Path]:
    """The `.conf` files under `directory` in upstream's walk order. OSError when the
    directory (or one under it) cannot be read."""
    return list(_walk(directory))


def _walk(directory: Path) -> Iterator[Path]:
    with os.scandir(directory) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(path)
        elif path.suffix == DROP_IN_SUFFIX:
            yield path


class DropIns:
    """What the drop-ins did: the configuration, which file last set each field (upstream
    dotted paths, for naming the file a validation problem comes from), and the problems
    found reading them."""

    def __init__(
        self,
        config: KubeletConfiguration,
        set_by: Mapping[str, Path],
        problems: list[Problem],
    ) -> None:
        self.config = config
        self.set_by = dict(set_by)
        self.problems = problems

    def file_for(self, field_path: str) -> Path | None:
        """The drop-in that set `field_path` last, else the one that set the nearest field
        above it last (a problem at `evictionHard.memory.available` names the drop-in
        that set that threshold, not a later one that set another)."""
        path = field_path
        while path:
            if path in self.set_by:
                return self.set_by[path]
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""
        return None


def apply_drop_ins(config: KubeletConfiguration, directory: Path) -> DropIns:
    """Merge the drop-ins of `directory` over `config` (the decoded, defaulted `--config`
    file or the defaults). A drop-in with a problem is left out whole and its problems
    name it; the others still apply, so every problem is reported in one start."""
    problems: list[Problem] = []
    try:
        files = drop_in_files(directory)
    except OSError as exc:
        problems.append(Problem("--config-dir", f"cannot read {directory}: {exc.strerror or exc}"))
        return DropIns(config, {}, problems)
    merged: object = config.to_upstream()
    set_by: dict[str, Path] = {}
    for file in files:
        data, read_problems = read_config_data(file)
        _, decode_problems = decode_config(data) if data is not None else (None, list[Problem]())
        found = read_problems + decode_problems
        if found or not isinstance(data, Mapping):
            problems += [Problem(str(file), str(p)) for p in found]
            continue
        body = {k: v for k, v in data.items() if k not in ("apiVersion", "kind")}
        for field in _field_paths(body):
            set_by[field] = file  # the last setter wins, as its value does
        merged = merge_patch(merged, body)
    result, merge_problems = decode_config(merged)
    problems += [Problem("--config-dir", f"{directory}: {p}") for p in merge_problems]
    return DropIns(result, set_by, problems)


def _field_paths(body: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted path of every field a drop-in sets: each key and, under an object, each
    of its keys (a map such as evictionHard yields `evictionHard` and its entries)."""
    for key, value in body.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        yield path
        if isinstance(value, Mapping):
            yield from _field_paths(value, path)

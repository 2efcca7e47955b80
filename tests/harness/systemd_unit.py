"""What systemd runs for a unit: its ExecStart= after drop-ins, with the environment of
Environment= and EnvironmentFile= substituted as systemd substitutes it (systemd.service(5),
"Command lines"; systemd.exec(5), EnvironmentFile=), for tests of the kubelet unit and
kubeadm's drop-in without a running systemd.

Rules followed: drop-ins apply in order after the unit; an empty `ExecStart=` resets the
list; `Environment=` takes space-separated, optionally quoted assignments, later ones
winning; `EnvironmentFile=` (a leading "-": the file may be missing) is read in order and
overrides `Environment=`; in the command line `$VAR` alone becomes the value split at
whitespace (none for an empty or unset variable) and `${VAR}` one word.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence

__all__ = ["exec_start_argv", "read_env_file"]

_VAR = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def read_env_file(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        words = shlex.split(value) if value else [""]
        out[key.strip()] = " ".join(words)
    return out


def exec_start_argv(units: Sequence[str], read_file: Callable[[str], str | None]) -> list[str]:
    """The argv of the unit's ExecStart (the unit text first, then its drop-ins).
    `read_file(path)` gives an EnvironmentFile's text, or None when it does not exist."""
    env: dict[str, str] = {}
    env_files: list[tuple[str, bool]] = []
    exec_start: list[str] = []
    for text in units:
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line
                continue
            if section != "[Service]":
                continue
            key, _, value = line.partition("=")
            if key == "Environment":
                for item in shlex.split(value):
                    name, _, val = item.partition("=")
                    env[name] = val
            elif key == "EnvironmentFile":
                env_files.append((value.removeprefix("-"), value.startswith("-")))
            elif key == "ExecStart":
                exec_start = [value] if value else []
    for path, optional in env_files:
        contents = read_file(path)
        if contents is None:
            if not optional:
                raise FileNotFoundError(f"EnvironmentFile={path} is missing")
            continue
        env.update(read_env_file(contents))
    if len(exec_start) != 1:
        raise ValueError(f"a simple service has exactly one ExecStart=, found {exec_start}")
    argv: list[str] = []
    for word in shlex.split(exec_start[0]):
        alone = _VAR.match(word)
        if alone:
            argv.extend(env.get(alone.group(1), "").split())
        else:
            argv.append(_BRACED.sub(lambda m: env.get(m.group(1), ""), word))
    return argv

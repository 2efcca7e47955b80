"""`--version`: klet's release and the upstream kubelet release it follows.

Upstream's kubelet prints `Kubernetes v1.34.4`. klet is not that binary, so it prints
its own release, read from the installed distribution's metadata, and the upstream
release whose feature gates, defaults and behaviour it follows (`KUBERNETES_VERSION`,
the one the gate table was generated from): `klet 0.1.0 (kubelet v1.34.4)`, or
`klet syncloop 0.1.0 (kubelet v1.34.4)` from a service.

As upstream, `--version` is answered before the configuration is read, so it needs no
valid flags or file. It is a Go boolean flag: `--version` and `--version=true` print,
`--version=false` is as if absent. Upstream's other values, `raw` (the build's details)
and `vX.Y.Z` (a version to report instead), are refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from klet.config.gates import KUBERNETES_VERSION

__all__ = ["split_version_flag", "version_line"]

_TRUE = ("1", "t", "T", "true", "TRUE", "True")
_FALSE = ("0", "f", "F", "false", "FALSE", "False")


def version_line(service: str | None = None) -> str:
    """`klet <release> (kubelet <upstream>)`; with `service`, that service's own
    distribution's release (`klet syncloop 0.1.0 (kubelet v1.34.4)`)."""
    # Imported here: most runs never ask, and importlib.metadata costs start-up time.
    from importlib.metadata import PackageNotFoundError, version

    distribution = f"klet-{service}" if service else "klet-libs"
    try:
        release = version(distribution)
    except PackageNotFoundError:
        release = "(not installed)"
    name = f"klet {service}" if service else "klet"
    return f"{name} {release} (kubelet {KUBERNETES_VERSION})"


def split_version_flag(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """Whether `argv` asks for the version, and `argv` without its `--version` flags
    (the last one given decides, as for any Go flag; nothing after `--` is looked at).

    Raises ValueError, naming the flag, for a value klet does not implement."""
    asked = False
    rest: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return asked, rest + list(argv[i:])
        name, eq, value = arg.partition("=")
        if name != "--version":
            rest.append(arg)
            continue
        if not eq or value in _TRUE:
            asked = True
        elif value in _FALSE:
            asked = False
        else:
            raise ValueError(
                f"--version={value}: klet implements only --version (true or false), "
                "not upstream's raw build details or an overridden version"
            )
    return asked, rest

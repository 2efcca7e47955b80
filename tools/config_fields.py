"""List the KubeletConfiguration fields no klet code reads, and what klet does about each.

Every field of `klet.config.kubelet` is looked for as an attribute access
(`cfg.pod_pids_limit`, `k.authentication.webhook.cache_ttl`) in the Python sources of
libs/ and services/, leaving out the config package's own declaration, flag and
validation modules (they touch every field without acting on any). A nested field counts
as read when its own name and each enclosing block's name are read somewhere: a coarse
match that can only err towards "read", which keeps a field accepted rather than refused.

`klet.config.support` classifies the unread ones: UNIMPLEMENTED (refused unless set to a
value klet implements), ACCEPTED (any value loads, with the reason) and IN_PROGRESS.
`check()` is what the unit test runs; `main()` prints the table that goes into the README:
`.venv/bin/python tools/config_fields.py`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from klet.config import support
from klet.config.kubelet import KubeletConfiguration, nested_class

ROOT = Path(__file__).resolve().parent.parent
# Modules that name every field without implementing any.
SKIP = {
    "libs/src/klet/config/kubelet.py",
    "libs/src/klet/config/flags.py",
    "libs/src/klet/config/validation.py",
    "libs/src/klet/config/support.py",
}

# Fields whose attribute names are common enough that the coarse match finds them read
# although no code reads the configuration's field.
NAME_CLASHES = {"logging.options"}


def sources(root: Path = ROOT) -> Iterator[Path]:
    for base in [root / "libs" / "src", *(root / "services").glob("*/src")]:
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel not in SKIP and "/rpc/gen/" not in rel:
                yield path


@functools.cache
def attributes_read(root: Path = ROOT) -> frozenset[str]:
    """Every attribute name accessed (or fetched with getattr and a literal) anywhere."""
    names: set[str] = set()
    for path in sources(root):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                names.add(node.args[1].value)
    return frozenset(names)


def field_chains(
    cls: type[Any] = KubeletConfiguration, prefix: str = "", chain: tuple[str, ...] = ()
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(upstream dotted path, attribute names from the root) of every leaf field, as
    `support.all_paths` counts them."""
    for f in dataclasses.fields(cls):
        path = prefix + f.metadata["json"]
        names = (*chain, f.name)
        if f.metadata["kind"] == "nested" and f.default is not None:
            yield from field_chains(nested_class(f), path + ".", names)
        else:
            yield path, names


def unread_fields(root: Path = ROOT) -> list[str]:
    read = attributes_read(root)
    return [
        path for path, names in field_chains() if path in NAME_CLASHES or not set(names) <= read
    ]


def check(root: Path = ROOT) -> list[str]:
    """Disagreements between the code and klet.config.support (empty when consistent)."""
    unread = set(unread_fields(root))
    problems = []
    for path in sorted(unread - set(support.UNIMPLEMENTED) - set(support.ACCEPTED)):
        if path not in support.IN_PROGRESS:
            problems.append(f"{path}: read by nothing and not listed in klet.config.support")
    for path in sorted(set(support.UNIMPLEMENTED) - unread):
        if support.UNIMPLEMENTED[path].partial:
            continue
        problems.append(f"{path}: refused as unimplemented, but some code reads it now")
    known = set(support.all_paths())
    for path in sorted({*support.UNIMPLEMENTED, *support.ACCEPTED, *support.IN_PROGRESS} - known):
        problems.append(f"{path}: listed in klet.config.support but not a field")
    return problems


def _show(value: object) -> str:
    return "the default" if value is support.DEFAULT else repr(value)


def main() -> None:
    problems = check()
    print("# KubeletConfiguration fields klet refuses unless left at the default")
    for path, rule in support.UNIMPLEMENTED.items():
        values = ", ".join(_show(a) for a in rule.allowed) if rule.check is None else rule.shown
        print(f"{path}\t{rule.reason}\taccepted: {values}")
    print("# fields klet accepts with any value, though nothing acts on them")
    for path, reason in support.ACCEPTED.items():
        print(f"{path}\t{reason}")
    if problems:
        print("# inconsistencies (fix klet.config.support)")
        for problem in problems:
            print(problem)
        raise SystemExit(1)


if __name__ == "__main__":
    main()

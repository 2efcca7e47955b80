"""The libs wheel's build hook: no wheel without the generated gRPC stubs.

`klet.rpc.gen` is generated from proto/ by `make proto` (tools/gen_proto.py) and is
git-ignored; the wheel ships it as a hatch artifact. A build from a tree where it was
never generated (a fresh clone, `uv build` before `make setup`) would otherwise give a
wheel without it, whose services fail at import on the node. This hook fails the build
instead, naming every proto file whose stubs are missing or older than the file and
the command that makes them.

A hook of hatchling's own interface (hatchling runs it in the build environment, where
it is installed); the check itself is `missing_stubs`, plain Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

GEN = Path("src/klet/rpc/gen")


def missing_stubs(proto_root: Path, gen_root: Path) -> list[str]:
    """The proto files under `proto_root` whose three generated modules (`_pb2.py`,
    `_pb2.pyi`, `_pb2_grpc.py`) are not all under `gen_root`, or are older than the
    proto file. Without a proto tree (a build from an sdist), the stubs must at least
    be there: then `gen_root` without `__init__.py` is the one problem."""
    if not proto_root.is_dir():
        return [] if (gen_root / "__init__.py").is_file() else [str(gen_root)]
    problems: list[str] = []
    for proto in sorted(proto_root.rglob("*.proto")):
        rel = proto.relative_to(proto_root).with_suffix("")
        outputs = [
            gen_root / rel.parent / f"{rel.name}{suffix}"
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
        ]
        if any(not out.is_file() or out.stat().st_mtime < proto.stat().st_mtime for out in outputs):
            problems.append(str(proto.relative_to(proto_root.parent)))
    return problems


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            # `make setup` installs libs editable before it generates the stubs (with
            # the grpcio-tools that install brings); an editable install reads them
            # from the source tree, where they are by the time anything imports them.
            return
        root = Path(self.root)
        problems = missing_stubs(root.parent / "proto", root / GEN)
        if problems:
            raise RuntimeError(
                "klet-libs: the generated gRPC stubs (klet.rpc.gen) are missing or older "
                f"than {', '.join(problems)}: run `make proto` (or `make setup`) first"
            )

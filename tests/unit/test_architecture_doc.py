"""ARCHITECTURE.md stays true where a program can tell.

Covers: the bus table lists every key the ACL grants (klet.bus.acl.ACCESS, the
authority), each with exactly its writers and at least its readers, and no key the ACL
does not know; keys that every service has one of (`events:<service>`,
`lease:<service>`) are listed once as a pattern, and every table's generation counter
once, as `gen:<table>`. Every service package under services/
is named with its distribution directory, every gRPC service in proto/ by its full name,
every function of the bus's Redis library, the ACL user names, the default service
ports, and the run-dir and root-dir paths of klet.model.layout. The floors of syncloop's
packages and of status-reporter's rooms the map draws are the ones the import-linter
layers contracts in pyproject.toml enforce, in the same order. The README points at
ARCHITECTURE.md, not at a file outside the repository.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from klet.bus.acl import ACCESS, ADMIN_USER, SERVICES, user_name
from klet.bus.functions import FUNCTIONS, LIBRARY
from klet.model.layout import (
    DEFAULT_SERVICE_PORTS,
    EVICTION,
    IMAGE_GC,
    SYNCLOOP,
    grpc_socket,
    pod_dir,
    port_files_dir,
    redis_socket,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "ARCHITECTURE.md"
SERVICE_PATTERN = "<service>"
EVERY_SERVICE = "each service"


def doc() -> str:
    return DOC.read_text()


@dataclass(frozen=True)
class Row:
    key: str
    written_by: str
    read_by: str


def bus_table(text: str) -> dict[str, Row]:
    """The rows of the table whose header has "written by" and "read by", by key."""
    lines = text.splitlines()
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if line.startswith("|") and {"written by", "read by"} <= set(cells(line))
        ),
        None,
    )
    if start is None:
        pytest.fail(f"{DOC.name}: no bus table (a header with 'written by' and 'read by')")
    header = cells(lines[start])
    writer_col, reader_col = header.index("written by"), header.index("read by")
    rows: dict[str, Row] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        key = row[0].strip("`")
        rows[key] = Row(key, row[writer_col], row[reader_col])
    return rows


def cells(line: str) -> list[str]:
    """A table line's cells, stripped and lower-cased."""
    return [c.strip().lower() for c in line.strip().strip("|").split("|")]


def services_named(cell: str) -> set[str]:
    return {s for s in SERVICES if re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", cell)}


GENERATIONS = "gen:<table>"


def granted() -> dict[str, tuple[set[str], set[str]]]:
    """Every key of the ACL grants as the doc names it -> (writers, readers). A key
    that every service has one of, with the service's name as one `:` segment, is
    folded into one pattern with `<service>` in that segment; a glob `:*` is `:<uid>`."""
    access: dict[str, tuple[set[str], set[str]]] = {}
    for service, a in ACCESS.items():
        lease_keys = [k for name in a.leases for k in (f"lease:{name}", f"lease:{name}:fence")]
        for key in (*a.writes, *a.publishes, *a.journals, *lease_keys):
            access.setdefault(key, (set(), set()))[0].add(service)
        for key in (*a.reads, *a.consumes, *a.tails):
            access.setdefault(key, (set(), set()))[1].add(service)
        # Every table's generation counter, one row: moved by the table's writer, read
        # by its readers and its writer.
        generations = access.setdefault(GENERATIONS, (set(), set()))
        if a.writes:
            generations[0].add(service)
        if a.reads or a.writes:
            generations[1].add(service)
    folded: dict[str, tuple[set[str], set[str]]] = {}
    for key, (writers, readers) in access.items():
        # The one glob grant is a stream per pod, which the doc names by its UID.
        name = key.replace(":*", ":<uid>")
        segments = key.split(":")
        for i, segment in enumerate(segments):
            if segment in SERVICES:
                variants = [":".join([*segments[:i], s, *segments[i + 1 :]]) for s in SERVICES]
                if all(v in access for v in variants):
                    name = ":".join([*segments[:i], SERVICE_PATTERN, *segments[i + 1 :]])
        w, r = folded.setdefault(name, (set(), set()))
        w |= writers
        r |= readers
    return folded


def test_the_bus_table_lists_every_key_the_acl_grants() -> None:
    rows = bus_table(doc())
    keys = granted()
    missing = sorted(set(keys) - set(rows))
    assert not missing, f"{DOC.name}'s bus table lacks the keys {missing} (klet.bus.acl)"
    unknown = sorted(set(rows) - set(keys))
    assert not unknown, f"{DOC.name}'s bus table lists {unknown}, which klet.bus.acl grants nobody"


def test_each_bus_key_names_its_writers_and_readers() -> None:
    rows = bus_table(doc())
    problems = []
    for key, (writers, readers) in sorted(granted().items()):
        row = rows.get(key)
        if row is None:
            continue  # reported by the test above
        if SERVICE_PATTERN in key:
            if EVERY_SERVICE not in row.written_by.lower():
                problems.append(f"`{key}`: 'written by' should say '{EVERY_SERVICE}'")
        elif services_named(row.written_by) != writers:
            problems.append(
                f"`{key}`: written by {sorted(writers)} (klet.bus.acl), the table says "
                f"{sorted(services_named(row.written_by))}"
            )
        unnamed = sorted(readers - services_named(row.read_by))
        if unnamed:
            problems.append(f"`{key}`: 'read by' does not name {unnamed}")
    assert not problems, f"{DOC.name}'s bus table:\n" + "\n".join(problems)


def test_every_service_package_is_named() -> None:
    text = doc()
    packages = sorted((ROOT / "services").glob("*/src/klet/*/__init__.py"))
    assert packages, "no service package found under services/"
    missing = []
    for init in packages:
        package, directory = init.parent.name, init.parents[3].name
        missing += [n for n in (f"`klet.{package}`", f"services/{directory}/") if n not in text]
    assert not missing, f"{DOC.name} does not name the service packages {missing}"


def grpc_services() -> list[str]:
    """Every gRPC service declared under proto/, as `<package>.<Service>`."""
    names = []
    for proto in sorted((ROOT / "proto").rglob("*.proto")):
        text = proto.read_text()
        package = re.search(r"^package\s+([\w.]+)\s*;", text, re.MULTILINE)
        for service in re.findall(r"^service\s+(\w+)", text, re.MULTILINE):
            names.append(f"{package.group(1)}.{service}" if package else service)
    return names


def test_every_grpc_service_in_proto_is_named() -> None:
    names = grpc_services()
    assert names, "no gRPC service found under proto/"
    missing = [n for n in names if f"`{n}`" not in doc()]
    assert not missing, f"{DOC.name} does not name the gRPC services {missing} (proto/)"


def test_the_bus_functions_and_users_are_named() -> None:
    text = doc()
    roles = [name.removeprefix(f"{LIBRARY}_") for name in FUNCTIONS]
    users = [ADMIN_USER, user_name("node-a", "syncloop").replace("syncloop", "<service>")]
    users = [u.replace("@node-a", "@<node>") for u in users]
    missing = [f"`{n}`" for n in (*roles, *users) if f"`{n}`" not in text]
    assert not missing, f"{DOC.name} does not name {missing} (klet.bus.functions, klet.bus.acl)"


def test_the_node_layout_is_named() -> None:
    run_dir, root_dir = Path("<run-dir>"), Path("<root-dir>")
    paths = [
        str(grpc_socket(run_dir, SYNCLOOP)),
        str(grpc_socket(run_dir, IMAGE_GC)),
        str(grpc_socket(run_dir, EVICTION)),
        f"{port_files_dir(run_dir, SERVICE_PATTERN)}/",
        str(redis_socket(run_dir)),
        f"{pod_dir(root_dir, '<uid>')}/",
    ]
    ports = [f"{port} {service}" for service, port in DEFAULT_SERVICE_PORTS.items()]
    text = doc()
    missing = [p for p in (*paths, *ports) if p not in text]
    assert not missing, f"{DOC.name} does not name {missing} (klet.model.layout)"


def test_the_readme_links_to_the_map_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "../shared/DESIGN.md" not in readme, "README.md links to ../shared/DESIGN.md"
    assert "(ARCHITECTURE.md)" in readme, "README.md does not link to ARCHITECTURE.md"


def layers_contract(container: str) -> list[set[str]]:
    """The floors of pyproject.toml's layers contract over `container`, top first."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers" and c.get("containers") == [container]
    ]
    assert len(contracts) == 1, f"pyproject.toml: no one layers contract over {container}"
    return [{name.strip() for name in re.split(r"[|:]", layer)} for layer in contracts[0]["layers"]]


def drawn_floors(text: str, heading: str) -> list[set[str]]:
    """The second cell of each row of the floor table under `heading`, top first."""
    section = text.split(heading, 1)
    assert len(section) == 2, f"{DOC.name}: no {heading!r} section"
    floors: list[set[str]] = []
    for line in section[1].splitlines():
        row = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("|") and row[0].isdigit():
            floors.append({name.strip("`/ ") for name in row[1].split("\\|")})
        elif floors and not line.startswith("|"):
            break
    return floors


def test_the_syncloop_floors_are_the_layers_contract() -> None:
    drawn = drawn_floors(doc(), "### Inside syncloop")
    enforced = layers_contract("klet.syncloop")
    assert drawn == enforced, (
        f"{DOC.name} draws syncloop's floors {drawn}, pyproject.toml's layers contract "
        f"enforces {enforced}"
    )


def test_the_status_reporter_rooms_are_the_layers_contract() -> None:
    drawn = drawn_floors(doc(), "### Inside status-reporter")
    enforced = layers_contract("klet.status_reporter")
    assert drawn == enforced, (
        f"{DOC.name} draws status-reporter's rooms {drawn}, pyproject.toml's layers "
        f"contract enforces {enforced}"
    )

"""tools/image/layers.py's guard against test code in the image, and the source trees it
guards.

Covers: `shipped_test_code` names the modules and packages called `testing` or `fake*`
under a tree and nothing else; no shipped source tree (libs and the five services) holds
one, while the test bed's fakes, which the image leaves out, are found by the same scan;
the import-linter contract that keeps shipped code from importing the test bed names
every top-level package and module of libs and the services, so a new one is covered.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tools.image.layers import ROOT, WORKSPACE_PROJECTS, shipped_test_code


def touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def test_modules_and_packages_named_as_test_code_are_named(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "bus/testing.py",
        "pod_source/sources/fakeapi.py",
        "cri/testing/__init__.py",
        "cri/testing/runtime.py",
        "stats/provider.py",
        "stats/testing_notes.txt",
        "model/unfaked.py",
        "bus/__pycache__/testing.cpython-311.pyc",
    )

    assert shipped_test_code(tmp_path) == [
        "bus/testing.py",
        "cri/testing",
        "pod_source/sources/fakeapi.py",
    ]


def test_no_shipped_source_tree_holds_test_code() -> None:
    for project in WORKSPACE_PROJECTS:
        assert shipped_test_code(ROOT / project / "src") == [], project
    # the same scan does see the fakes where they belong (not shipped)
    assert shipped_test_code(ROOT / "testbed/src") == ["klet/testbed/fakes"]


def test_every_shipped_package_may_not_import_the_test_bed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and c["forbidden_modules"] == ["klet.testbed"]
    ]
    shipped = {
        f"klet.{path.stem}"
        for project in WORKSPACE_PROJECTS
        for path in (ROOT / project / "src/klet").iterdir()
        if path.name != "__pycache__" and (path.is_dir() or path.suffix == ".py")
    }

    assert shipped - set(contract["source_modules"]) == set()

"""maxOpenFiles reaches every service process: the five services started as `klet run`
starts them, with `--max-open-files`, each run with that RLIMIT_NOFILE (soft and hard),
read from /proc/<pid>/limits as an operator would check it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.harness.node import SERVICES, KletNode


def open_files_limit(pid: int) -> tuple[int, int]:
    text = Path(f"/proc/{pid}/limits").read_text()
    match = re.search(r"^Max open files\s+(\d+)\s+(\d+)", text, re.MULTILINE)
    assert match, text
    return int(match[1]), int(match[2])


def test_every_service_runs_with_max_open_files(node_factory: Any) -> None:
    # Not this test process's limit, nor the default 1000000: the flag must be what
    # the services apply.
    node: KletNode = node_factory(extra_flags=["--max-open-files", "4321"])
    node.start()
    for service in SERVICES:
        pid = node.procs[service].pid
        assert pid is not None
        assert open_files_limit(pid) == (4321, 4321), service

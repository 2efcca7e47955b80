"""Pytest fixtures that start the real components through ``klet.devstack``.

Register them once, in the top-level ``tests/conftest.py``::

    pytest_plugins = ["tests.harness.fixtures"]

``devstack`` is session-scoped: one Redis, registry (holding the standard test images)
and containerd for the whole run, in a short private directory under /tmp (containerd's
socket path must stay under 108 bytes, which pytest's ``tmp_path`` does not promise).
Tests sharing it must use unique pod names/UIDs and clean up their pods. ``redis_server``
gives a test a Redis of its own, for tests that stop, restart or flush it.

Every Redis here is the one `klet up` runs: a unix socket in a 0700 directory, the
default user off, per-node per-service ACL users (``RedisServer.service_flags`` gives a
service its URL, user and password file; ``RedisServer.admin`` is for the test itself).

Set ``KLET_KEEP_DEVSTACK=1`` to keep the directory (logs, configs) after the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.devstack import DevStack, RedisServer


@pytest.fixture(scope="session")
def devstack() -> Iterator[DevStack]:
    """A started DevStack (Redis, registry with test images, containerd + CNI)."""
    dir = Path(tempfile.mkdtemp(prefix="klet-", dir="/tmp"))
    stack = DevStack(dir)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
        if not os.environ.get("KLET_KEEP_DEVSTACK"):
            shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private, empty Redis for one test; ``restart()`` keeps its port."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()

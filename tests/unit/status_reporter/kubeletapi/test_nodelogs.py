"""`GET /logs/<path>` (kubeletapi/nodelogs.py): the node's log directory as Go's
FileServer serves it upstream (listing, redirect to a directory's slash, index.html,
files whole and by Range), a path cleaned of `..`, a symlink out of the directory
refused (403, naming the path), and the two switches that close it (405)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
from klet.status_reporter.kubeletapi.app import create_app
from klet.status_reporter.kubeletapi.nodelogs import listing, resolve

from tests.unit.status_reporter.kubeletapi.test_app import World


def node_logs(tmp_path: Path) -> Path:
    root = tmp_path / "varlog"
    (root / "pods" / "ns_web_u1").mkdir(parents=True)
    (root / "syslog").write_text("line 1\nline 2\n")
    (root / "a b.log").write_text("spaced\n")
    (root / "pods" / "ns_web_u1" / "0.log").write_text("container\n")
    (tmp_path / "secret").write_text("not a log\n")
    (root / "escape").symlink_to(tmp_path / "secret")
    (root / "escape-dir").symlink_to(tmp_path)
    (root / "inside").symlink_to(root / "syslog")
    return root


def test_resolve(tmp_path: Path) -> None:
    root = node_logs(tmp_path)
    assert resolve(root, "syslog").file == (root / "syslog").resolve()
    assert resolve(root, "").listing == listing(root)
    assert resolve(root, "pods/").listing is not None
    assert resolve(root, "pods").location == "pods/"  # Go redirects to the slash
    assert resolve(root, "pods/ns_web_u1").location == "ns_web_u1/"
    assert resolve(root, "inside").file == (root / "syslog").resolve()
    # `..` is cleaned away from the root, never above it
    assert resolve(root, "../secret").status == 404
    assert resolve(root, "pods/../syslog").file == (root / "syslog").resolve()
    for path in ("escape", "escape-dir/", "escape-dir/secret"):
        answer = resolve(root, path)
        assert answer.status == 403, path
        assert answer.body.startswith(f"/logs/{path.rstrip('/')}: leads out of {root}")
    assert resolve(root, "nothing").status == 404


def test_listing_is_go_fileservers(tmp_path: Path) -> None:
    root = node_logs(tmp_path)
    page = listing(root)
    assert page.startswith('<!doctype html>\n<meta name="viewport" content="width=device-width">\n')
    rows = page.split("<pre>\n")[1].removesuffix("</pre>\n").splitlines()
    assert rows == [
        '<a href="a%20b.log">a b.log</a>',
        '<a href="escape">escape</a>',
        '<a href="escape-dir/">escape-dir/</a>',
        '<a href="inside">inside</a>',
        '<a href="pods/">pods/</a>',
        '<a href="syslog">syslog</a>',
    ]


def test_index_html_is_served_for_its_directory(tmp_path: Path) -> None:
    root = node_logs(tmp_path)
    (root / "pods" / "index.html").write_text("<p>index</p>")
    assert resolve(root, "pods/").file == (root / "pods" / "index.html").resolve()


async def get(world: World, path: str, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(world.deps))
    async with httpx.AsyncClient(transport=transport, base_url="https://n1") as client:
        return await client.get(path, headers=headers)


def with_settings(world: World, **changes: object) -> World:
    settings = dataclasses.replace(world.deps.settings, **changes)  # type: ignore[arg-type]
    world.deps = dataclasses.replace(world.deps, settings=settings)
    return world


async def test_the_endpoint(tmp_path: Path) -> None:
    root = node_logs(tmp_path)
    world = with_settings(World(tmp_path), node_log_dir=root)
    r = await get(world, "/logs/")
    assert (r.status_code, r.headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert '<a href="syslog">syslog</a>' in r.text
    r = await get(world, "/logs/syslog")
    assert (r.status_code, r.text) == (200, "line 1\nline 2\n")
    r = await get(world, "/logs/syslog", Range="bytes=7-")
    assert (r.status_code, r.text) == (206, "line 2\n")
    r = await get(world, "/logs/pods/ns_web_u1/0.log")
    assert r.text == "container\n"
    r = await get(world, "/logs/pods")
    assert (r.status_code, r.headers["location"]) == (301, "pods/")
    r = await get(world, "/logs/escape")
    assert r.status_code == 403
    assert r.text == f"/logs/escape: leads out of {root}, refused\n"
    assert (await get(world, "/logs/%2e%2e/secret")).status_code == 404
    assert (await get(world, "/logs/nothing")).text == "404 page not found\n"


async def test_switched_off(tmp_path: Path) -> None:
    root = node_logs(tmp_path)
    world = with_settings(World(tmp_path), node_log_dir=root, enable_system_log_handler=False)
    r = await get(world, "/logs/syslog")
    assert (r.status_code, r.text) == (405, "logs endpoint is disabled.\n")
    world = with_settings(World(tmp_path, debugging=False), node_log_dir=root)
    r = await get(world, "/logs/")
    assert (r.status_code, r.text) == (405, "Debug endpoints are disabled.\n")

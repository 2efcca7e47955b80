"""`GET /logs/<path>`: the node's log directory, as upstream's kubelet serves /var/log.

Upstream hands the path to Go's `http.FileServer(http.Dir("/var/log"))`: a directory is
a `<pre>` list of links (sub-directories with a trailing `/`, names sorted), a directory
asked without its trailing slash is redirected to it, a directory holding `index.html`
serves that page, and a file is served whole (with Range). klet answers the same, with
one refusal upstream does not make: a path whose real location (symlinks resolved) is
outside the log directory is 403, naming the path, so a symlink in /var/log cannot
expose the rest of the node through `nodes/log`. `..` cannot climb out either: the
path is cleaned first, as Go does.

Authorization is the 10250 server's: `/logs/` is the `log` subresource of the node
(attributes.py), as upstream. With `enableDebuggingHandlers: false` the route answers
405 as upstream's disabled debugging handlers do, and with `enableSystemLogHandler:
false` 405 "logs endpoint is disabled.". Node log queries (`?query=`, the NodeLogQuery
gate with `enableSystemLogQuery`) are refused at start (klet.config.support).

`resolve` decides, without serving; `listing` renders a directory. Both are pure but for
reading the filesystem they are about.
"""

from __future__ import annotations

import html
import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

DISABLED = "logs endpoint is disabled.\n"


@dataclass(frozen=True)
class Answer:
    """What to answer: `status` 200 with `file` (a file to serve) or `listing` (a
    directory's page), 301 to `location`, or an error with `body`."""

    status: int
    file: Path | None = None
    listing: str | None = None
    location: str = ""
    body: str = ""


def resolve(root: Path, url_path: str) -> Answer:
    """The answer to `/logs/<url_path>` over the log directory `root`."""
    cleaned = posixpath.normpath("/" + url_path)  # never above "/"
    relative = cleaned.lstrip("/")
    target = root / relative if relative else root
    real_root = root.resolve()
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError):
        return Answer(404, body="404 page not found\n")
    if real != real_root and real_root not in real.parents:
        return Answer(403, body=f"/logs/{relative}: leads out of {root}, refused\n")
    if real.is_dir():
        if url_path and not url_path.endswith("/"):
            return Answer(301, location=posixpath.basename(cleaned) + "/")
        index = real / "index.html"
        if index.is_file() and index.resolve().parent == real:
            return Answer(200, file=index)
        try:
            return Answer(200, listing=listing(real))
        except OSError as err:
            return Answer(500, body=f"Error reading directory: {err.strerror}\n")
    if not real.is_file():
        return Answer(404, body="404 page not found\n")
    return Answer(200, file=real)


def listing(directory: Path) -> str:
    """A directory's page as Go's FileServer writes it: one link per entry, sorted by
    name, a directory's with a trailing slash."""
    rows = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        name = entry.name + ("/" if entry.is_dir() else "")
        rows.append(f'<a href="{quote(name)}">{html.escape(name)}</a>\n')
    return (
        '<!doctype html>\n<meta name="viewport" content="width=device-width">\n<pre>\n'
        + "".join(rows)
        + "</pre>\n"
    )

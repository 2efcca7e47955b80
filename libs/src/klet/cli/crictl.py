"""`klet crictl pods|ps|images`: what the runtime holds, in crictl's table layout.

Reads the runtime endpoint from `--runtime-endpoint`, or from the `endpoints.json` that
`klet up` writes into its run directory, so after `make run` a plain
`.venv/bin/klet crictl --run-dir .run pods` works.

Names, labels and image tags are whatever whoever created the sandbox or container
wrote (any CRI client of the runtime), so the table shows control characters escaped
(klet.model.podhistory `printable`), never raw on the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.model.podhistory import printable


def _age(ns: int) -> str:
    seconds = max(0, int(time.time() - ns / 1e9))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def table(rows: list[list[str]]) -> str:
    """`rows` as crictl's aligned table, every cell `printable`."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


async def _run(endpoint: str, what: str, all_: bool) -> str:
    cri = RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=10))
    try:
        if what == "pods":
            rows = [["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"]]
            for s in sorted(await cri.list_pod_sandboxes(), key=lambda s: -s.created_at):
                rows.append(
                    [
                        s.id[:13],
                        _age(s.created_at),
                        s.state.value.removeprefix("SANDBOX_"),
                        s.name,
                        s.namespace,
                        str(s.attempt),
                    ]
                )
        elif what == "ps":
            pods = {s.id: s.name for s in await cri.list_pod_sandboxes()}
            rows = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"]]
            for c in sorted(await cri.list_containers(), key=lambda c: -c.created_at):
                if not all_ and c.state.value != "CONTAINER_RUNNING":
                    continue
                rows.append(
                    [
                        c.id[:13],
                        c.image_ref[:20] or c.image,
                        _age(c.created_at),
                        c.state.value.removeprefix("CONTAINER_").capitalize(),
                        c.name,
                        str(c.attempt),
                        c.sandbox_id[:13],
                        c.labels.get(L.POD_NAME, pods.get(c.sandbox_id, "")),
                    ]
                )
        else:
            rows = [["IMAGE", "TAG", "IMAGE ID", "SIZE"]]
            for i in await cri.list_images():
                for tag in i.repo_tags or ("<none>:<none>",):
                    repo, _, t = tag.rpartition(":")
                    rows.append(
                        [repo, t, i.id.removeprefix("sha256:")[:13], f"{i.size / 1e6:.3g}MB"]
                    )
        return table(rows)
    finally:
        await cri.close()


def crictl(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="klet crictl")
    p.add_argument("--run-dir", type=Path, default=Path(".run"))
    p.add_argument("--runtime-endpoint", "-r", default="")
    p.add_argument("what", choices=["pods", "ps", "images"])
    p.add_argument("-a", "--all", action="store_true", help="ps: also exited containers")
    args = p.parse_args(argv)
    endpoint = args.runtime_endpoint
    if not endpoint:
        info = args.run_dir / "endpoints.json"
        try:
            endpoint = json.loads(info.read_text())["runtime_endpoint"]
        except (OSError, ValueError, KeyError) as err:
            print(f"klet crictl: no --runtime-endpoint and cannot read {info}: {err}")
            return 2
    print(asyncio.run(_run(endpoint, args.what, args.all)))
    return 0

"""KubeClient.watch over a stand-in connection pool: one GET with watch, resourceVersion,
allowWatchBookmarks and timeoutSeconds; lines split across chunks come out as events in
order, with their objects the raw dicts (bookmarks too) and blank lines skipped; an ERROR
event ends the watch with the error of its code (410 Gone, carrying the reason), as does
an error answer (403 Forbidden) and a failed connection (Unavailable, counted as
"<error>"); a line that is not JSON fails it; and a consumer that leaves early
unblocks the read in progress instead of waiting for the server's timeout."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from klet.kube import Forbidden, Gone, KubeSettings, Unavailable, WatchEvent
from klet.kube.client import KubeClient

from tests.unit.test_kube_tokens import kubeconfig


class Socket:
    def __init__(self, closed: threading.Event) -> None:
        self.closed = closed

    def shutdown(self, how: int) -> None:
        self.closed.set()


class Connection:
    def __init__(self, closed: threading.Event) -> None:
        self.sock = Socket(closed)


class Answer:
    """A streamed HTTP answer: yields `chunks`, then (when `hold`) blocks until its
    socket is shut down."""

    def __init__(self, status: int, chunks: list[bytes], *, hold: bool = False) -> None:
        self.status = status
        self.data = b"".join(chunks)
        self.chunks = chunks
        self.hold = hold
        self.closed = threading.Event()
        self.connection = Connection(self.closed)
        self.released = False

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        yield from self.chunks
        if self.hold:
            self.closed.wait(5)

    def shutdown(self) -> None:
        self.closed.set()

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        self.released = True


class Pool:
    def __init__(self, answer: Answer | BaseException) -> None:
        self.answer = answer
        self.urls: list[str] = []

    def request(self, method: str, url: str, **_: Any) -> Answer:
        self.urls.append(url)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def clear(self) -> None:
        pass


def client_with(tmp_path: Path, pool: Pool, observed: list[tuple[str, str]]) -> KubeClient:
    client = KubeClient(
        KubeSettings(kubeconfig=kubeconfig(tmp_path, {"token": "t"})),
        observer=lambda code, method, host, seconds: observed.append((code, method)),
    )
    client._rest.pool_manager = pool  # type: ignore[assignment]
    return client


async def events_of(client: KubeClient) -> list[WatchEvent]:
    return [e async for e in client.watch("/api/v1/pods", resource_version="7", timeout_s=60)]


async def test_events_in_order_as_raw_dicts_over_one_request(tmp_path: Path) -> None:
    chunks = [
        b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a"},"x-unknown":1}}\n{"ty',
        b'pe":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"9"}}}\n\n',
        b'{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12"}}}\n',
    ]
    pool, observed = Pool(Answer(200, chunks)), list[tuple[str, str]]()
    client = client_with(tmp_path, pool, observed)
    assert await events_of(client) == [
        WatchEvent("ADDED", {"kind": "Pod", "metadata": {"name": "a"}, "x-unknown": 1}),
        WatchEvent("MODIFIED", {"metadata": {"name": "a", "resourceVersion": "9"}}),
        WatchEvent("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "12"}}),
    ]
    [url] = pool.urls
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert urllib.parse.urlsplit(url).path == "/api/v1/pods"
    assert query == {
        "watch": "true",
        "resourceVersion": "7",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "60",
    }
    assert observed == [("200", "GET")]
    await client.close()


async def test_an_error_event_ends_the_watch_with_the_error_of_its_code(tmp_path: Path) -> None:
    chunks = [
        b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n',
        b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired",'
        b'"message":"too old resource version: 7 (20)"}}\n',
        b'{"type":"ADDED","object":{"metadata":{"name":"never"}}}\n',
    ]
    client = client_with(tmp_path, Pool(Answer(200, chunks)), [])
    seen: list[WatchEvent] = []
    with pytest.raises(Gone) as caught:
        async for event in client.watch("/api/v1/pods", resource_version="7"):
            seen.append(event)
    assert [e.object["metadata"]["name"] for e in seen] == ["a"]
    assert caught.value.reason == "Expired"
    assert "too old resource version: 7 (20)" in str(caught.value)
    await client.close()


async def test_an_error_answer_a_failed_connection_and_a_garbled_line(tmp_path: Path) -> None:
    observed: list[tuple[str, str]] = []
    denied = Answer(403, [b'{"kind":"Status","reason":"Forbidden"}'])
    client = client_with(tmp_path, Pool(denied), observed)
    with pytest.raises(Forbidden):
        await events_of(client)
    client._rest.pool_manager = Pool(OSError("refused"))  # type: ignore[assignment]
    with pytest.raises(Unavailable):
        await events_of(client)
    assert observed == [("403", "GET"), ("<error>", "GET")]
    garbled = Pool(Answer(200, [b"<html>not json\n"]))
    client._rest.pool_manager = garbled  # type: ignore[assignment]
    with pytest.raises(ValueError):
        await events_of(client)
    await client.close()


async def test_a_consumer_leaving_early_unblocks_the_read(tmp_path: Path) -> None:
    answer = Answer(200, [b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n'], hold=True)
    client = client_with(tmp_path, Pool(answer), [])
    stream = cast(AsyncGenerator[WatchEvent], client.watch("/api/v1/pods", resource_version="7"))
    first = await anext(stream)
    assert first.object == {"metadata": {"name": "a"}}
    await stream.aclose()
    assert answer.closed.wait(2), "the read in progress was not unblocked"
    await client.close()

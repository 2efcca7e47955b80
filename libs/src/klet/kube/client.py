"""Async apiserver access over the official `kubernetes` client (its pieces loaded by
klet.kube.library, the only module that imports the package, without the parts klet
never uses: about 15 MB resident less in each service that talks to the apiserver).

The `kubernetes` package loads the kubeconfig (client certificates, tokens, exec
plugins, CA, embedded data) and keeps the TLS connection pool; this adapter sends raw
JSON requests through its REST client, the layer below the ApiClient (adding the
Authorization header of a token kubeconfig and the User-Agent itself, see
klet.kube.tokens), in a worker thread (`asyncio.to_thread`, STYLE rule 9: the one adapter
around a blocking library), so callers deal in plain dicts — the same JSON the
manifests, the bus and the HTTP API speak — and in our own exceptions. A client-side
token bucket enforces kubeAPIQPS/kubeAPIBurst.

The observer (klet.kube.observing.RequestObserver) is told what client-go tells its
metrics adapter: each request's code and duration, its body's size (measured as the
JSON the `kubernetes` client sends: the same `json.dumps`, serialized once more only
when there is an observer) and its answer's, the rate limiter's wait, and whether it
was a retry (the attempt number its caller set). Watches report their code and the time
until their answer began, as client-go's do, not sizes.

A watch is the client's own `kubernetes.watch.Watch`: it splits the chunked answer into
lines, turns ERROR events into ApiException (mapped here to our Gone/Unavailable/...), and
its stop() unblocks a read in progress. Three things stay ours, each for a reason: the
request (the "API function" Watch.stream calls is a plain GET of the path, because the
typed list_* functions would turn every object into a model class and back, losing
fields the model lacks, while callers want the raw dicts and bookmarks as they came);
Watch.stream's own resume is off (timeoutSeconds is set, so it makes exactly one request:
the caller decides between rewatch and relist, as upstream's reflector does); and each
watch runs on a thread of its own that hands events to the loop through a queue — Watch
is a blocking iterator that sits in one read for up to timeoutSeconds, so iterating it
through `asyncio.to_thread` would hold one of the loop's few executor threads (six on
this two-core host) per open watch, taking them from ordinary requests.

Only a client whose certificate rotateCertificates renews imports klet.kube.bootstrap (and
so `cryptography`, about 8 MB resident): pod-source and syncloop build a client with no
rotated certificate, and loading the certificate machinery there cost each of them
that much for nothing (issue 42, cluster-mode memory).

Requests run in the event loop's default executor unless the client is given
`threads` of its own: a client whose callers can be made to call at will (the kubelet
API's TokenReviews, caused by anyone who reaches port 10250) then never takes the
threads the node Lease's renewal needs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from klet.kube.errors import KubeError, Unavailable, for_status
from klet.kube.library import (
    ApiException,
    Configuration,
    RESTClientObject,
    Watch,
    load_kube_config,
)
from klet.kube.observing import NO_ANSWER, RequestObserver, attempt_number
from klet.kube.settings import KubeSettings, WatchEvent
from klet.kube.tokens import TokenFile, token_file
from klet.model.flowcontrol import TokenBucket
from klet.model.types import JSON

T = TypeVar("T")

__all__ = ["NO_ANSWER", "CertificateFile", "KubeClient", "RawWatch", "RequestObserver"]


class CertificateFile:
    """Whether the client certificate file changed since the last look (another inode
    or mtime behind the path: `kubelet-client-current.pem` re-pointed), looking at most
    every `every_s`; thread-safe enough for its use (a lost race only clears twice)."""

    def __init__(self, path: str | None, *, every_s: float = 5.0) -> None:
        self.path = path
        self.every_s = every_s
        self._next = 0.0
        self._seen = self._identity()

    def _identity(self) -> tuple[int, int] | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def changed(self) -> bool:
        if not self.path or time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + self.every_s
        now = self._identity()
        if now is None or now == self._seen:
            return False
        self._seen = now
        return True


class RawWatch(Watch):
    """The client's Watch, keeping each event's object the JSON dict it came as: no
    model classes (a pod read into V1Pod and back loses the fields the model does not
    know), no second parse. A blank line is skipped; a line that is not JSON fails the
    watch (ValueError) rather than vanishing; an ERROR event's Status gets the fields
    Watch.stream reads (code, reason, message) when the server left any out.

    Built without Watch's ApiClient and model registry (pydantic and the models,
    several MB resident): Watch uses the ApiClient only to turn events into models
    (unmarshal_event, replaced here) and to read an error answer (the request raises on
    one before Watch sees it), and looks a model class up in `kubernetes.client.models`
    only when not told the return type, which it is here (the raw dicts). test_kube_watch
    runs stream() end to end, so a library whose Watch needs more of its own state
    fails there."""

    def __init__(self) -> None:
        self._raw_return_type = dict
        self._stop = False
        self._api_client = None  # type: ignore[assignment]  # never read (docstring)
        self.resource_version = None

    def unmarshal_event(self, data: str, return_type: object) -> dict[str, Any] | None:
        if not data.strip():
            return None
        event: dict[str, Any] = json.loads(data)
        if event.get("type") == "ERROR":
            status = event.get("object")
            status = dict(status) if isinstance(status, dict) else {}
            status["code"] = int(status.get("code") or 0)
            status.setdefault("reason", "")
            status.setdefault("message", "")
            event["object"] = status
        event["raw_object"] = event.get("object")
        return event


class KubeClient:
    def __init__(
        self,
        settings: KubeSettings,
        *,
        threads: int | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        """`threads`: requests run on a pool of that many threads of this client's own
        instead of the loop's default executor. `observer`: told of every request."""
        self.settings = settings
        self._observer = observer
        self._executor = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-client")
            if threads is not None
            else None
        )
        configuration = Configuration()
        load_kube_config(config_file=str(settings.kubeconfig), client_configuration=configuration)
        if settings.rotated_certificate is not None:
            from klet.kube.bootstrap import kubeconfig_embedded_pair

            if kubeconfig_embedded_pair(settings.kubeconfig):
                # rotateCertificates seeded the store from the embedded pair and renews
                # it there: present the store's file (its changes are watched below).
                configuration.cert_file = str(settings.rotated_certificate)
                configuration.key_file = str(settings.rotated_certificate)
        # Our callers retry with their own back-off and log once per outage; urllib3's
        # own retries would add a warning per attempt.
        configuration.retries = False
        self._configuration = configuration
        path = token_file(settings.kubeconfig)
        self._token_file = TokenFile(path) if path is not None else None
        self._rest = RESTClientObject(configuration)
        self.host = configuration.host.rstrip("/")
        self._host_label = urllib.parse.urlsplit(self.host).netloc
        # Taken on the event loop, before the request moves to a worker thread.
        self._bucket = TokenBucket(settings.qps, settings.burst, now=time.monotonic())
        self._cert = CertificateFile(configuration.cert_file)

    async def close(self) -> None:
        await self._in_thread(self._rest.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        """`asyncio.to_thread`, on this client's own threads when it has them."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        return await loop.run_in_executor(
            self._executor, functools.partial(context.run, call, *args)
        )

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header of the kubeconfig's token, if it has one (a client
        certificate authenticates in the TLS handshake instead); in a worker thread, as
        a token file may be read."""
        if self._token_file is not None:
            return {"Authorization": self._token_file.header()}
        key = self._configuration.get_api_key_with_prefix("BearerToken")
        return {"Authorization": key} if key else {}

    def _observe(
        self,
        code: int | str,
        method: str,
        started: float,
        *,
        sent: int | None = None,
        received: int | None = None,
    ) -> None:
        """Tell the observer of one request: its outcome, whether it was a retry, and
        the sizes known (None: not measured)."""
        observer = self._observer
        if observer is None:
            return
        host = self._host_label
        observer(str(code), method, host, time.monotonic() - started)
        if attempt_number() > 1:
            observer.retried(str(code), method, host)
        if sent is not None:
            observer.request_size(method, host, sent)
        if received is not None:
            observer.response_size(method, host, received)

    def _body_size(self, body: Any) -> int | None:
        """The bytes the `kubernetes` client sends for `body` with a JSON content type
        (its `json.dumps`; ASCII, so characters are bytes), when someone is told."""
        if self._observer is None:
            return None
        if body is None:
            return 0
        return len(body) if isinstance(body, bytes) else len(json.dumps(body))

    def _url(self, path: str, params: Mapping[str, Any] | None) -> str:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return self.host + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _request_sync(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
        timeout_s: float | None,
    ) -> Any:
        headers = {
            "Accept": "application/json",
            "Content-Type": content_type,
            "User-Agent": self.settings.user_agent,
        }
        url = self._url(path, params)
        if self._cert.changed():
            # A rotated client certificate (klet.kube.rotation): new connections present
            # it; pooled ones would keep the old identity, so they go.
            self._rest.pool_manager.clear()
        sent = self._body_size(body)
        started = time.monotonic()
        try:
            headers.update(self.auth_headers())
            r = self._rest.request(
                method,
                url,
                headers=headers,
                body=body,
                _request_timeout=timeout_s or self.settings.timeout_s,
            )
            data = r.read()
        except ApiException as err:
            self._observe(err.status or NO_ANSWER, method, started, sent=sent)
            raise Unavailable(f"{method} {path}: {err.reason}", status=err.status or 0) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            self._observe(NO_ANSWER, method, started, sent=sent)
            raise Unavailable(f"{method} {path}: {err}") from err
        # client-go observes an answer's size when it succeeded or came with a body.
        answered = len(data or b"") if r.status < 300 or data else None
        self._observe(r.status, method, started, sent=sent, received=answered)
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if r.status >= 300:
            reason, message = "", text[:500]
            try:
                status = json.loads(text)
                reason, message = status.get("reason", ""), status.get("message", message)
            except ValueError:
                pass
            raise for_status(r.status, f"{method} {path}: {r.status} {message}", reason)
        return json.loads(text) if text else None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> Any:
        asked = time.monotonic()
        wait = self._bucket.take(asked)
        if wait:
            await asyncio.sleep(wait)
        if self._observer is not None and self._bucket.qps > 0:
            self._observer.rate_limited(method, self._host_label, time.monotonic() - asked)
        result: Any = await self._in_thread(
            self._request_sync, method, path, params, body, content_type, timeout_s
        )
        return result

    async def get(self, path: str, **params: Any) -> Any:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: JSON) -> Any:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: JSON) -> Any:
        return await self.request("PUT", path, body=body)

    async def patch(self, path: str, body: Any, *, kind: str = "strategic") -> Any:
        content = {
            "strategic": "application/strategic-merge-patch+json",
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
        }[kind]
        return await self.request("PATCH", path, body=body, content_type=content)

    async def delete(self, path: str, body: JSON | None = None) -> Any:
        return await self.request("DELETE", path, body=body)

    async def watch(
        self, path: str, *, resource_version: str, timeout_s: int = 300, **params: Any
    ) -> AsyncIterator[WatchEvent]:
        """Events of one watch request until the server ends it (then the caller rewatches).

        Raises `Gone` (410) when `resource_version` is too old: relist.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        stop = threading.Event()
        watcher = RawWatch()
        opened: list[Any] = []  # whether the server answered (an answer is counted by its status)
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
            **params,
        }

        def post(item: WatchEvent | BaseException | None) -> None:
            # The consumer may be gone (and its loop closed) by the time the stream
            # yields again; nothing is waiting for the item then.
            if stop.is_set():
                return
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:
                stop.set()

        def open_stream(**_: Any) -> Any:
            # Watch.stream's "API function": our own GET, answered unread, so that the
            # objects stay the raw dicts our callers deal in.
            started = time.monotonic()
            try:
                r = self._rest.pool_manager.request(
                    "GET",
                    self._url(path, query),
                    headers={
                        "Accept": "application/json",
                        "User-Agent": self.settings.user_agent,
                        **self.auth_headers(),
                    },
                    preload_content=False,
                    retries=False,
                    timeout=urllib3.Timeout(connect=10, read=timeout_s + 30),
                )
            except BaseException:
                self._observe(NO_ANSWER, "GET", started)
                raise
            opened.append(r)
            self._observe(r.status, "GET", started)
            if r.status >= 300:
                raise for_status(r.status, f"watch {path}: {r.status} {r.data[:300]!r}")
            return r

        def run() -> None:
            try:
                # timeout_seconds given: Watch.stream makes this one request and does
                # not resume it itself (the caller rewatches or relists).
                for event in watcher.stream(open_stream, timeout_seconds=timeout_s):
                    if stop.is_set():
                        break
                    if event is not None:
                        post(WatchEvent(event["type"], event["object"]))
                post(None)
            except ApiException as err:
                # An ERROR event, which Watch.stream raises as "<reason>: <message>".
                reason, _, message = str(err.reason or "").partition(": ")
                post(for_status(err.status or 0, f"watch {path}: {message}", reason))
            except (urllib3.exceptions.HTTPError, OSError) as err:
                post(Unavailable(f"watch {path}: {err}"))
            except (KubeError, ValueError) as err:
                post(err)
            except (KeyError, TypeError) as err:
                post(ValueError(f"watch {path}: an event without {err}"))

        thread = threading.Thread(target=run, name=f"watch {path}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            # Unblocks the thread's read so it ends now rather than at the timeout.
            watcher.stop()

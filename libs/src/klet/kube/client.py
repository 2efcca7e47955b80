"""Async apiserver access over the official `kubernetes` client: the only module that
imports it.

The `kubernetes` package loads the kubeconfig (client certificates, tokens, CA, embedded
data) and keeps the TLS connection pool; this adapter sends raw JSON requests through
its REST client (adding the Authorization header of a token kubeconfig itself, see
klet.kube.tokens), in a worker thread (`asyncio.to_thread`, STYLE rule 9: the one adapter
around a blocking library), so callers deal in plain dicts — the same JSON the
manifests, the bus and the HTTP API speak — and in our own exceptions. A client-side
token bucket enforces kubeAPIQPS/kubeAPIBurst. Watches run in a thread each and hand
their events to the loop through a queue.

Requests run in the event loop's default executor unless the client is given
`threads` of its own: a client whose callers can be made to call at will (the kubelet
API's TokenReviews, caused by anyone who reaches port 10250) then never takes the
threads the node Lease's renewal needs.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from klet.kube.settings import KubeSettings, WatchEvent
from klet.kube.tokens import TokenFile, token_file
from klet.model.flowcontrol import TokenBucket
from klet.model.types import JSON
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")

RequestObserver = Callable[[str, str, str, float], None]
"""Told of each request sent: (status code or "<error>", method, host:port, seconds
until the answer was read, or until a watch's answer began, or until it failed); called
from the request's thread (klet.obs.restclient.RestClientMetrics)."""
NO_ANSWER = "<error>"


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
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(
            config_file=str(settings.kubeconfig), client_configuration=configuration
        )
        # Our callers retry with their own back-off and log once per outage; urllib3's
        # own retries would add a warning per attempt.
        configuration.retries = False
        self._configuration = configuration
        path = token_file(settings.kubeconfig)
        self._token_file = TokenFile(path) if path is not None else None
        self._api = k8s_client.ApiClient(configuration)
        self._api.user_agent = settings.user_agent
        self.host = configuration.host.rstrip("/")
        self._host_label = urllib.parse.urlsplit(self.host).netloc
        # Taken on the event loop, before the request moves to a worker thread.
        self._bucket = TokenBucket(settings.qps, settings.burst, now=time.monotonic())
        self._cert = CertificateFile(configuration.cert_file)

    async def close(self) -> None:
        await self._in_thread(self._api.close)
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

    def _observe(self, code: int | str, method: str, started: float) -> None:
        if self._observer is not None:
            self._observer(str(code), method, self._host_label, time.monotonic() - started)

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
        headers = {"Accept": "application/json", "Content-Type": content_type}
        url = self._url(path, params)
        if self._cert.changed():
            # A rotated client certificate (klet.kube.rotation): new connections present
            # it; pooled ones would keep the old identity, so they go.
            self._api.rest_client.pool_manager.clear()
        started = time.monotonic()
        try:
            headers.update(self.auth_headers())
            r = self._api.rest_client.request(
                method,
                url,
                headers=headers,
                body=body,
                _request_timeout=timeout_s or self.settings.timeout_s,
            )
            data = r.read()
        except ApiException as err:
            self._observe(err.status or NO_ANSWER, method, started)
            raise Unavailable(f"{method} {path}: {err.reason}", status=err.status or 0) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            self._observe(NO_ANSWER, method, started)
            raise Unavailable(f"{method} {path}: {err}") from err
        self._observe(r.status, method, started)
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
        wait = self._bucket.take(time.monotonic())
        if wait:
            await asyncio.sleep(wait)
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
        held: list[Any] = []  # the open response, so the consumer can close it
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

        def run() -> None:
            started = time.monotonic()
            try:
                r = self._api.rest_client.pool_manager.request(
                    "GET",
                    self._url(path, query),
                    headers={"Accept": "application/json", **self.auth_headers()},
                    preload_content=False,
                    retries=False,
                    timeout=urllib3.Timeout(connect=10, read=timeout_s + 30),
                )
                held.append(r)
                self._observe(r.status, "GET", started)
                if r.status >= 300:
                    raise for_status(r.status, f"watch {path}: {r.status} {r.data[:300]!r}")
                buffer = b""
                for chunk in r.stream(4096, decode_content=True):
                    if stop.is_set():
                        break
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            event = json.loads(line)
                            if event.get("type") == "ERROR":
                                obj = event.get("object", {})
                                code = int(obj.get("code", 0))
                                raise for_status(
                                    code,
                                    f"watch {path}: {obj.get('message', '')}",
                                    obj.get("reason", ""),
                                )
                            post(WatchEvent(event["type"], event["object"]))
                r.release_conn()
                post(None)
            except (urllib3.exceptions.HTTPError, OSError) as err:
                if not held:  # no answer at all (an answer is counted by its status)
                    self._observe(NO_ANSWER, "GET", started)
                post(Unavailable(f"watch {path}: {err}"))
            except (KubeError, ValueError) as err:
                post(err)

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
            for r in held:
                # Unblocks the thread's read so it ends now rather than at the timeout.
                with contextlib.suppress(Exception):
                    r.shutdown() if hasattr(r, "shutdown") else r.close()

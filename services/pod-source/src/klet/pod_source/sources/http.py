"""The static-pod URL source (`staticPodURL`, `--manifest-url`).

Polls the URL every httpCheckFrequency with the configured headers. The body is one Pod
or a v1 PodList, in YAML or JSON; an empty body means "no pods" (an empty snapshot).

Failure handling follows upstream's rule that a source that cannot be read keeps the
pods it last delivered: a status outside 2xx, a connection error, a timeout, an
oversized or invalid body all produce no snapshot, so nothing is removed. Each distinct
error is logged (and counted) once until a fetch succeeds again, not at every poll.

A body identical to the last one (good or bad) is not decoded again: the common case is
a URL that never changes, and re-validating it every 20 s would be wasted work. A new
body is decoded in a worker thread, since YAML parsing is pure Python (manifests.py).

The timeout (10 s, as upstream's client) covers the whole request, body included:
httpx's own timeouts apply per network operation, so a server that trickles bytes
would otherwise hold the poll forever.

Redirects are followed by hand (at most 10, as Go's client), each checked by
`redirect_problem` before it is followed. Upstream's Go client follows any redirect
and forwards every custom header except the credential ones; here a redirect from
https to http is refused (the manifest, which the node runs as root, would travel
unauthenticated), and so is a redirect to another host while custom headers
(`--manifest-url-header`, often a token) are configured, since those headers were
meant for the configured server only. A refused redirect is a read error: the last
good set stays.

The size bound (10 MiB) holds for the body as decoded: a server asked for
`Accept-Encoding: identity` may still send gzip or deflate, and 64 KiB of gzip inflate
to 64 MiB in one step of httpx's own decoder, before any check could run. So the body
is read raw and inflated here with zlib, at most up to the bound (hand-written on
purpose: httpx's decoders take no output limit); any other encoding is refused.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import zlib
from collections.abc import Mapping, Sequence
from typing import Final

import httpx
from klet.model.records import SourceName
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.pod_source.inbox import Inbox
from klet.pod_source.manifests import ManifestError, pods_from_url_body
from klet.pod_source.metrics import Metrics
from klet.pod_source.validation import MAX_URL_BODY_BYTES

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
MAX_REDIRECTS: Final = 10
# zlib's window bits that accept a gzip or a zlib header (HTTP's "deflate" is zlib).
_GZIP_OR_ZLIB: Final = 32 + zlib.MAX_WBITS
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def redirect_problem(origin: httpx.URL, target: httpx.URL, *, custom_headers: bool) -> str | None:
    """Why the redirect from the configured URL `origin` to `target` must not be
    followed; None when it may be."""
    if target.scheme not in _DEFAULT_PORTS:
        return f"redirect to {target} refused: not an http or https URL"
    if origin.scheme == "https" and target.scheme != "https":
        return f"redirect from https to {target} refused: it would drop TLS"
    if custom_headers and not _same_server(origin, target):
        return (
            f"redirect to {target} refused: another host, and the configured "
            "manifest URL headers are only for the configured host"
        )
    return None


def _same_server(a: httpx.URL, b: httpx.URL) -> bool:
    """Same host and port, counting an upgrade from http to https on the default ports."""
    if (a.host or "").lower() != (b.host or "").lower():
        return False
    port_a = a.port or _DEFAULT_PORTS.get(a.scheme)
    port_b = b.port or _DEFAULT_PORTS.get(b.scheme)
    return port_a == port_b or (a.scheme, port_a, b.scheme, port_b) == ("http", 80, "https", 443)


class HttpSource:
    """Polls the manifest URL and offers a snapshot when the body changes."""

    def __init__(
        self,
        *,
        url: str,
        headers: Mapping[str, Sequence[str]],
        node_name: str,
        period_s: float,
        inbox: Inbox,
        metrics: Metrics,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tls_verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._url = url
        # True: the system's CAs, as upstream's client; tests pass their own CA.
        self._tls_verify = tls_verify
        # Repeated header names are sent as repeated headers, as Go's http.Header does.
        self._headers = [(k, v) for k, values in headers.items() for v in values]
        self._node_name = node_name
        self._period_s = period_s
        self._inbox = inbox
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._last_body: bytes | None = None  # the last body that became a snapshot
        self._bad_body: bytes | None = None  # the last body refused (already reported)
        self._once = OnceLogger(log, level=logging.WARNING)

    @property
    def name(self) -> SourceName:
        return "http"

    async def run(self) -> None:
        async with self._client() as client:
            while True:
                await self.run_once(client)
                await asyncio.sleep(self._period_s)

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            follow_redirects=False,
            timeout=self._timeout_s,
            trust_env=False,
            verify=self._tls_verify,
        )

    async def run_once(self, client: httpx.AsyncClient) -> None:
        """One fetch: offer a snapshot on a new good body, report a new error otherwise."""
        try:
            body = await self._fetch(client)
        except ManifestError as err:
            self._refused(err, body=None)
            return
        except Exception as err:  # noqa: BLE001 - a bad answer must not end the source
            self._refused(ManifestError("read", f"{type(err).__name__}: {err}"), body=None)
            return
        if body == self._bad_body:
            self._inbox.polled()  # refused already, and reported
            return
        pods: list[JSON] | None = None
        if body != self._last_body:
            try:
                # YAML parsing is pure Python (see manifests.py): keep it off the loop.
                pods = await asyncio.to_thread(
                    pods_from_url_body, body, url=self._url, node_name=self._node_name
                )
            except ManifestError as err:
                self._refused(err, body=body)
                return
            except Exception as err:  # noqa: BLE001 - manifests.py converts; belt and braces
                self._refused(ManifestError("parse", f"{type(err).__name__}: {err}"), body=body)
                return
        self._once.clear("url", "manifest URL readable again", url=self._url)
        self._bad_body = None
        if pods is None:
            self._inbox.polled()  # the same bytes as the last snapshot
            return
        self._last_body = body
        self._metrics.snapshots.labels(source="http").inc()
        self._inbox.offer("http", pods)

    def _refused(self, err: ManifestError, *, body: bytes | None) -> None:
        """Keep the last good set; report `err` unless it is the one reported last."""
        self._bad_body = body
        self._inbox.polled()
        if self._once.error(
            "url",
            f"manifest URL {self._url} refused: {err.message}; keeping the last good set",
            cause=(err.reason, err.message),
            url=self._url,
            reason=err.reason,
            error=err.message,
        ):
            self._metrics.manifest_errors.labels(source="http", reason=err.reason).inc()

    async def _fetch(self, client: httpx.AsyncClient) -> bytes:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._follow(client)
        except TimeoutError as err:
            raise ManifestError("read", f"no complete answer within {self._timeout_s:g}s") from err
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            raise ManifestError("read", f"{type(err).__name__}: {err}".rstrip(": ")) from err

    async def _follow(self, client: httpx.AsyncClient) -> bytes:
        """GET the URL, following the redirects `redirect_problem` allows."""
        origin = url = httpx.URL(self._url)
        for _ in range(MAX_REDIRECTS + 1):
            headers = [("Accept-Encoding", "identity"), *self._headers]
            async with client.stream("GET", url, headers=headers) as resp:
                if resp.is_redirect:
                    target = url.join(resp.headers["location"])
                    problem = redirect_problem(origin, target, custom_headers=bool(self._headers))
                    if problem is not None:
                        raise ManifestError("read", problem)
                    url = target
                    continue
                if not 200 <= resp.status_code < 300:
                    raise ManifestError(
                        "read", f"HTTP {resp.status_code} {resp.reason_phrase}".strip()
                    )
                body = BoundedBody(resp.headers.get("content-encoding", ""))
                async for chunk in resp.aiter_raw():
                    body.add(chunk)
                return body.finish()
        raise ManifestError("read", f"more than {MAX_REDIRECTS} redirects")


class BoundedBody:
    """A response body decoded as it arrives, refused once it exceeds `limit` bytes."""

    def __init__(self, content_encoding: str, *, limit: int = MAX_URL_BODY_BYTES) -> None:
        encodings = [e.strip().lower() for e in content_encoding.split(",") if e.strip()]
        encodings = [e for e in encodings if e != "identity"]
        if len(encodings) > 1 or (encodings and encodings[0] not in ("gzip", "x-gzip", "deflate")):
            raise ManifestError("read", f"Content-Encoding {content_encoding!r} not supported")
        self._inflater = zlib.decompressobj(_GZIP_OR_ZLIB) if encodings else None
        self._limit = limit
        self._data = bytearray()
        self._fed = False  # any compressed bytes at all (an empty body is just empty)

    def _too_large(self) -> ManifestError:
        return ManifestError("too_large", f"body larger than {self._limit} bytes")

    def _append(self, data: bytes) -> None:
        self._data += data
        if len(self._data) > self._limit:
            raise self._too_large()

    def add(self, chunk: bytes) -> None:
        if self._inflater is None:
            self._append(chunk)
            return
        self._fed = self._fed or bool(chunk)
        room = self._limit - len(self._data) + 1
        try:
            self._append(self._inflater.decompress(chunk, room))
        except zlib.error as err:
            raise ManifestError("read", f"body not valid compressed data: {err}") from err
        if self._inflater.unconsumed_tail:
            raise self._too_large()

    def finish(self) -> bytes:
        if self._inflater is not None and self._fed:
            if not self._inflater.eof:
                raise ManifestError("read", "compressed body ends early")
            self._append(self._inflater.flush())
        return bytes(self._data)

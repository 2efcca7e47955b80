"""Run one probe or lifecycle-hook handler: exec, httpGet, tcpSocket, grpc.

Each function performs the action once and answers a `HandlerResult` whose message is
the text upstream puts into its events (the command's output, `HTTP probe failed with
statuscode: 503`, `dial tcp 10.88.0.7:80: connect: connection refused`, ...). They never
raise for a failing target: a failure is a result. `error` marks the cases upstream
treats as "the probe could not run" (a CRI error other than a timeout, a port name the
container does not declare), which the prober retries and reports differently.

httpGet follows upstream's prober: the scheme's TLS is not verified, the User-Agent is
`kube-probe/<major>.<minor>` unless the spec sets one, `Accept: */*` unless the spec sets
it (an empty Accept removes it), 200..399 is success, redirects to the same host are
followed (at most 10), a redirect to another host is not followed and counts as success
with a warning, and at most 10 KiB of the body is read. The timeout covers the whole
exchange, redirects included.

An HTTPS request that a plain-HTTP server answers fails as Go's client fails it, `http:
server gave HTTP response to HTTPS client` (`scheme_mismatch`): Go decides so when the
first TLS record header it reads is `HTTP/`, and so does klet, reading that header
through the TLS context's message callback (OpenSSL's own error, "wrong version
number", says only that the answer was not TLS). Probes stop there, as upstream's do;
lifecycle hooks ask for `http_fallback`, upstream's runHTTPHandler: the same request
again over HTTP without its Authorization header, and when that one is answered (any
status) the result says which host:port it fell back on (`fallback`), for the hook's
Event and counter.
"""

from __future__ import annotations

import asyncio
import errno
import math
import ssl
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urljoin, urlsplit

from klet.cri import CRIError
from klet.model.types import JSON, ContainerID
from klet.rpc.healthcheck import check_health

if TYPE_CHECKING:
    import httpx

# The upstream release klet follows (status-reporter reports it as kubeletVersion).
PROBE_USER_AGENT = "kube-probe/1.34"
MAX_OUTPUT_BYTES = 10 * 1024  # upstream reads at most 10 KiB of exec output or HTTP body
MAX_REDIRECTS = 10
EXEC_GUARD_S = 5.0  # how long past its own timeout we wait for the runtime's ExecSync


@dataclass(frozen=True)
class HandlerResult:
    ok: bool
    message: str  # output / error text, as upstream reports it in events
    warning: bool = False  # ok, but upstream records a ProbeWarning event with `message`
    error: bool = False  # the handler could not run at all (upstream's probe error)
    answered: bool = False  # httpGet: the server answered, whatever the status code
    scheme_mismatch: bool = False  # httpGet: an HTTPS request got a plain-HTTP answer
    fallback: str = ""  # httpGet: host:port the HTTPS request was retried on over HTTP


class ExecRunner(Protocol):
    """CRI ExecSync, as `klet.cri.RuntimeClient` and the fake runtime offer it."""

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]: ...


def _text(data: bytes) -> str:
    return data[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")


async def run_exec(
    cri: ExecRunner, container_id: ContainerID, command: list[str], *, timeout_s: float
) -> HandlerResult:
    """Run `command` in the container; exit code 0 is success, the output is the message.

    `timeout_s` <= 0 means no timeout (lifecycle hooks run without one upstream).
    """
    seconds = 0 if timeout_s <= 0 else max(1, math.ceil(timeout_s))
    timed_out = f'command "{" ".join(command)}" timed out'
    call = cri.exec_sync(container_id, list(command), timeout_s=seconds)
    try:
        if seconds > 0:
            async with asyncio.timeout(seconds + EXEC_GUARD_S):
                code, stdout, stderr = await call
        else:
            code, stdout, stderr = await call
    except TimeoutError:
        return HandlerResult(False, timed_out)
    except CRIError as err:
        if err.code == "DEADLINE_EXCEEDED":
            return HandlerResult(False, timed_out)
        return HandlerResult(False, str(err), error=True)
    output = _text(stdout + stderr)
    return HandlerResult(code == 0, output)


def resolve_port(port: object, container: JSON) -> int:
    """upstream extractPort: a number, or a container port's name (or a number as text).

    Raises ValueError with upstream's message when there is no usable port.
    """
    if isinstance(port, bool) or port is None:
        raise ValueError(f"intOrString had no kind: {port!r}")
    if isinstance(port, int):
        value = port
    else:
        name = str(port)
        found = next(
            (p.get("containerPort") for p in container.get("ports") or [] if p.get("name") == name),
            None,
        )
        if found is not None:
            value = int(found)
        else:
            try:
                value = int(name, 10)
            except ValueError:
                raise ValueError(f'strconv.Atoi: parsing "{name}": invalid syntax') from None
    if 0 < value < 65536:
        return value
    raise ValueError(f"invalid port number: {value}")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe_url(scheme: str, host: str, port: int, path: str) -> str:
    parts = urlsplit(path or "")
    location = parts.path or ""
    if location and not location.startswith("/"):
        location = "/" + location
    url = f"{scheme.lower()}://{_host_port(host, port)}{location}"
    if parts.query:
        url += f"?{parts.query}"
    return url


def request_headers(action: JSON) -> list[tuple[str, str]]:
    """The spec's httpHeaders plus upstream's User-Agent and Accept defaults."""
    given = [
        (str(h.get("name", "")), str(h.get("value", ""))) for h in action.get("httpHeaders") or []
    ]
    names = {name.lower() for name, _ in given}
    headers = [(n, v) for n, v in given if not (n.lower() == "accept" and v == "")]
    if "user-agent" not in names:
        headers.append(("User-Agent", PROBE_USER_AGENT))
    if "accept" not in names:
        headers.append(("Accept", "*/*"))
    return headers


_tls: ssl.SSLContext | None = None


def _insecure_tls() -> ssl.SSLContext:
    """One TLS context for every probe: upstream probes never verify certificates."""
    global _tls
    if _tls is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        _tls = ctx
    return _tls


SCHEME_MISMATCH = "http: server gave HTTP response to HTTPS client"  # Go's ErrSchemeMismatch
_RECORD_HEADER = 256  # ssl's _TLSContentType.HEADER: the 5 bytes before each record


class _AnswerSniffer:
    """A TLS context for one request that notes whether the server answered in plain
    HTTP: a record header read as `HTTP/` (Go's RecordHeaderError check). OpenSSL hands
    every record header to the context's message callback before it checks the record,
    so the header of the answer that fails the handshake is seen. One context per
    request (about 1 ms to make), so concurrent requests never share the note."""

    def __init__(self) -> None:
        self.http_answer = False
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # upstream probes and hooks never verify
        # CPython's SSLContext._msg_callback (OpenSSL's SSL_CTX_set_msg_callback): the
        # only way the record bytes reach Python when the handshake fails.
        setattr(ctx, "_msg_callback", self._record)  # noqa: B010 (absent from typeshed)
        self.context = ctx

    def _record(
        self,
        conn: object,
        direction: str,
        version: object,
        content_type: int,
        msg_type: object,
        data: bytes,
    ) -> None:
        if direction == "read" and content_type == _RECORD_HEADER and data[:5] == b"HTTP/":
            self.http_answer = True


def _os_error(err: BaseException | None, depth: int = 0) -> OSError | None:
    """The first OSError with an errno behind `err` (causes, contexts, exception groups)."""
    if err is None or depth > 10:
        return None
    if isinstance(err, OSError) and err.errno is not None:
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = _os_error(inner, depth + 1)
            if found is not None:
                return found
    return _os_error(err.__cause__ or err.__context__, depth + 1)


def _dial_error(err: BaseException, addr: str) -> str:
    """A connection failure worded as Go's net package words it."""
    cause = _os_error(err)
    if cause is not None:
        reasons = {
            errno.ECONNREFUSED: "connect: connection refused",
            errno.EHOSTUNREACH: "connect: no route to host",
            errno.ENETUNREACH: "connect: network is unreachable",
            errno.ECONNRESET: "read: connection reset by peer",
        }
        reason = reasons.get(cause.errno or 0, (cause.strerror or str(cause)).lower())
        return f"dial tcp {addr}: {reason}"
    return f"dial tcp {addr}: {err}"


async def _get(
    client: httpx.AsyncClient, url: str, headers: list[tuple[str, str]]
) -> tuple[int, bytes]:
    """GET `url`, following same-host redirects: (status, the first 10 KiB of the body)."""
    first_host = urlsplit(url).hostname
    for _ in range(MAX_REDIRECTS + 1):
        request = client.build_request("GET", url, headers=headers)
        response = await client.send(request, stream=True)
        try:
            body = b""
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) >= MAX_OUTPUT_BYTES:
                    break
            body = body[:MAX_OUTPUT_BYTES]
        finally:
            await response.aclose()
        location = response.headers.get("location")
        if not (response.is_redirect and location):
            return response.status_code, body
        target = urljoin(url, location)
        if urlsplit(target).hostname != first_host:
            return response.status_code, body  # upstream: do not follow to another host
        url = target
    raise _TooManyRedirects()


class _TooManyRedirects(Exception):
    def __str__(self) -> str:
        return f"stopped after {MAX_REDIRECTS} redirects"


def _without_authorization(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, v) for n, v in headers if n.lower() != "authorization"]


async def run_http_get(
    action: JSON,
    *,
    pod_ip: str,
    container: JSON,
    timeout_s: float,
    http_fallback: bool = False,
) -> HandlerResult:
    """One HTTP GET as upstream's prober sends it; see the module docstring.

    `http_fallback` (lifecycle hooks): an HTTPS request answered in plain HTTP is sent
    again over HTTP without its Authorization header; when that one gets an answer, its
    result is returned with `fallback` set, else the HTTPS request's."""
    scheme = str(action.get("scheme") or "HTTP").lower()
    host = str(action.get("host") or pod_ip)
    try:
        port = resolve_port(action.get("port"), container)
    except ValueError as err:
        return HandlerResult(False, str(err), error=True)
    path = str(action.get("path") or "")
    headers = request_headers(action)
    result = await _http_get(scheme, host, port, path, headers, timeout_s=timeout_s)
    if not (http_fallback and result.scheme_mismatch):
        return result
    retry = await _http_get(
        "http", host, port, path, _without_authorization(headers), timeout_s=timeout_s
    )
    if not retry.answered:
        return result  # upstream keeps the HTTPS request's error
    return replace(retry, fallback=_host_port(host, port))


async def _http_get(
    scheme: str,
    host: str,
    port: int,
    path: str,
    headers: list[tuple[str, str]],
    *,
    timeout_s: float,
) -> HandlerResult:
    url = probe_url(scheme, host, port, path)
    # httpx (about 10 MB resident) loads with the first HTTP handler a pod has, not
    # with syncloop: most nodes probe by exec or TCP, or not at all.
    import httpx

    sniffer = _AnswerSniffer() if scheme == "https" else None
    client = httpx.AsyncClient(
        verify=sniffer.context if sniffer is not None else _insecure_tls(),
        follow_redirects=False,
        timeout=None,
        trust_env=False,
    )
    # httpx adds its own defaults; a probe sends only what upstream's would.
    for name in ("User-Agent", "Accept", "Accept-Encoding"):
        client.headers.pop(name, None)
    client.headers["Connection"] = "close"
    shown = url if urlsplit(url).path else url + "/"
    try:
        async with client:
            async with asyncio.timeout(timeout_s):
                status, body = await _get(client, url, headers)
    except TimeoutError:
        return HandlerResult(
            False,
            f'Get "{shown}": context deadline exceeded '
            "(Client.Timeout exceeded while awaiting headers)",
        )
    except _TooManyRedirects as err:
        return HandlerResult(False, f'Get "{shown}": {err}')
    except (httpx.HTTPError, OSError) as err:
        if sniffer is not None and sniffer.http_answer:
            return HandlerResult(False, f'Get "{shown}": {SCHEME_MISMATCH}', scheme_mismatch=True)
        return HandlerResult(False, f'Get "{shown}": {_dial_error(err, _host_port(host, port))}')
    text = body.decode("utf-8", errors="replace")
    if 200 <= status < 400:
        if status >= 300:
            return HandlerResult(
                True,
                f"Probe terminated redirects, Response body: {text}",
                warning=True,
                answered=True,
            )
        return HandlerResult(True, text, answered=True)
    return HandlerResult(False, f"HTTP probe failed with statuscode: {status}", answered=True)


async def run_tcp(action: JSON, *, pod_ip: str, container: JSON, timeout_s: float) -> HandlerResult:
    """Open a TCP connection to the target and close it again."""
    host = str(action.get("host") or pod_ip)
    try:
        port = resolve_port(action.get("port"), container)
    except ValueError as err:
        return HandlerResult(False, str(err), error=True)
    addr = _host_port(host, port)
    try:
        async with asyncio.timeout(timeout_s):
            _reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return HandlerResult(False, f"dial tcp {addr}: i/o timeout")
    except OSError as err:
        return HandlerResult(False, _dial_error(err, addr))
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass  # the peer may reset a connection it never wanted; the connect succeeded
    return HandlerResult(True, "")


async def run_grpc(action: JSON, *, pod_ip: str, timeout_s: float) -> HandlerResult:
    """grpc.health.v1.Health/Check of `service` on the pod IP and the given port."""
    port = action.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return HandlerResult(False, f"invalid port number: {port}", error=True)
    result = await check_health(
        pod_ip,
        port=port,
        service=str(action.get("service") or ""),
        timeout_s=timeout_s,
        user_agent=PROBE_USER_AGENT,
    )
    return HandlerResult(result.serving, result.message)

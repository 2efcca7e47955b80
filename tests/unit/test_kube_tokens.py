"""Bearer tokens of a kubeconfig: the tokenFile of the current user found (relative to the
kubeconfig), re-read once a minute with the last token kept when a re-read fails, and
KubeClient sending the Authorization header itself for a token file and for a token
(a client-certificate kubeconfig sends none), beside its User-Agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from klet.kube import KubeSettings, Unavailable
from klet.kube.client import KubeClient
from klet.kube.tokens import TokenFile, token_file


def kubeconfig(tmp_path: Path, user: dict[str, Any], *, other_user: bool = True) -> Path:
    users = [{"name": "me", "user": user}]
    if other_user:
        users.insert(0, {"name": "someone", "user": {"tokenFile": "/wrong"}})
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": users,
        "contexts": [
            {"name": "other", "context": {"cluster": "c", "user": "someone"}},
            {"name": "mine", "context": {"cluster": "c", "user": "me"}},
        ],
        "current-context": "mine",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_token_file_of_the_current_user(tmp_path: Path) -> None:
    assert token_file(kubeconfig(tmp_path, {"tokenFile": "/var/run/t"})) == Path("/var/run/t")
    assert token_file(kubeconfig(tmp_path, {"tokenFile": "sub/t"})) == tmp_path / "sub/t"
    assert token_file(kubeconfig(tmp_path, {"token": "abc"})) is None
    bad = tmp_path / "bad"
    bad.write_text("- [not a kubeconfig")
    assert token_file(bad) is None
    assert token_file(tmp_path / "missing") is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_file_is_re_read_once_a_minute(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    clock = Clock()
    tokens = TokenFile(path, clock=clock)
    assert tokens.header() == "Bearer one"
    path.write_text("two\n")
    clock.now += 59
    assert tokens.header() == "Bearer one"
    clock.now += 1
    assert tokens.header() == "Bearer two"
    path.unlink()  # mid-rotation: keep the last token
    clock.now += 60
    assert tokens.header() == "Bearer two"
    path.write_text("")
    clock.now += 60
    assert tokens.header() == "Bearer two"


def test_a_missing_token_file_without_a_token_is_unavailable(tmp_path: Path) -> None:
    tokens = TokenFile(tmp_path / "none")
    with pytest.raises(Unavailable, match="tokenFile"):
        tokens.header()


async def test_client_sends_the_token_file_it_re_reads(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("projected-1")
    client = KubeClient(KubeSettings(kubeconfig=kubeconfig(tmp_path, {"tokenFile": "token"})))
    assert client.auth_headers() == {"Authorization": "Bearer projected-1"}
    sent: list[dict[str, str]] = []

    class Response:
        status = 200

        def read(self) -> bytes:
            return b"{}"

    def request(method: str, url: str, *, headers: dict[str, str], **_: Any) -> Response:
        sent.append(headers)
        return Response()

    client._rest.request = request  # type: ignore[method-assign,assignment]
    assert client._request_sync("GET", "/api", None, None, "application/json", None) == {}
    assert sent[0]["Authorization"] == "Bearer projected-1"
    assert sent[0]["User-Agent"] == "klet"  # KubeSettings.user_agent, sent by the client itself
    await client.close()


async def test_client_sends_a_static_token_and_nothing_for_certificates(tmp_path: Path) -> None:
    client = KubeClient(KubeSettings(kubeconfig=kubeconfig(tmp_path, {"token": "static"})))
    assert client.auth_headers() == {"Authorization": "Bearer static"}
    await client.close()
    client = KubeClient(KubeSettings(kubeconfig=kubeconfig(tmp_path, {}, other_user=False)))
    assert client.auth_headers() == {}
    await client.close()

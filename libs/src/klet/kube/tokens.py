"""The bearer token of a kubeconfig's current user, for the requests `KubeClient` sends.

`KubeClient` sends its requests through the official client's REST layer directly, which
adds no credentials of its own: a client certificate works (it lives in the TLS pool),
but a token user (`token`, or `tokenFile` as a ServiceAccount kubeconfig names the
projected token) went out anonymous. This reads the token the way kubectl does, and
re-reads a `tokenFile` whenever the file changes: the kubelet rotates a projected
service-account token in place (a new file behind the same path), and a long-running
service must follow it rather than keep the token it started with.

Users authenticated by an exec plugin or an auth provider are left to the official
client's own refresh (`KubeClient` asks it when this finds no token).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import yaml


class KubeconfigError(ValueError):
    """The kubeconfig cannot be read or names a token file that cannot be read."""


def _named(entries: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(what)
            return body if isinstance(body, dict) else {}
    raise KubeconfigError(f"{path}: no {what} named {name!r}")


def current_user(path: Path) -> dict[str, Any]:
    """The `user` block of the kubeconfig's current context ({} when it has none)."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise KubeconfigError(f"{path}: {err}") from err
    if not isinstance(config, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig")
    context_name = config.get("current-context")
    if not context_name:
        return {}
    context = _named(config.get("contexts"), str(context_name), "context", path)
    user_name = context.get("user")
    if not user_name:
        return {}
    return _named(config.get("users"), str(user_name), "user", path)


class BearerToken:
    """`header()`: the Authorization header value, `Bearer <token>`; a token file is
    read again when its identity (inode, size, modification time) changes."""

    def __init__(self, *, token: str | None = None, token_file: Path | None = None) -> None:
        if (token is None) == (token_file is None):
            raise ValueError("exactly one of token and token_file")
        self._token = token
        self._file = token_file
        self._seen: tuple[int, int, int] | None = None
        self._lock = threading.Lock()  # requests run in worker threads

    @classmethod
    def from_kubeconfig(cls, path: Path) -> BearerToken | None:
        """The token of the current user (`token` wins over `tokenFile`, as kubectl
        has it), a relative token file taken from the kubeconfig's directory; None for
        a user without one (client certificates, exec plugins)."""
        user = current_user(path)
        if user.get("token"):
            return cls(token=str(user["token"]))
        if user.get("tokenFile"):
            file = Path(str(user["tokenFile"]))
            token = cls(token_file=file if file.is_absolute() else path.parent / file)
            token.header()  # a missing file is a configuration error: say so at start
            return token
        return None

    def header(self) -> str:
        if self._file is None:
            assert self._token is not None
            return f"Bearer {self._token}"
        with self._lock:
            try:
                st = os.stat(self._file)
                seen = (st.st_ino, st.st_size, st.st_mtime_ns)
                if seen != self._seen or self._token is None:
                    self._token = self._file.read_text().strip()
                    self._seen = seen
            except OSError as err:
                if self._token is None:
                    raise KubeconfigError(f"tokenFile {self._file}: {err.strerror}") from err
                # A rotation in progress: the token read last is still valid for a while.
            return f"Bearer {self._token}"

"""The bearer token of a kubeconfig's user, for the requests KubeClient sends itself.

KubeClient sends raw requests through the official client's REST layer, below the
ApiClient that would add the Authorization header, so the header is added here: a
token the official loader read (`token`, an exec plugin's, refreshed by its own hook
when it expires), or a `tokenFile`. The official loader reads a `tokenFile` once and
never again; the kubelet rewrites a projected ServiceAccount token before it expires
(the chart's rbac.create kubeconfig), so `TokenFile` re-reads it once a minute, as
client-go does, and keeps the last token when a re-read fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from klet.kube.errors import Unavailable


def token_file(kubeconfig: Path) -> Path | None:
    """The `tokenFile` of the kubeconfig's current user (relative to the kubeconfig's
    directory), or None when it has none."""
    try:
        config: Any = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError):
        return None  # the official loader reports what is wrong with it
    if not isinstance(config, dict):
        return None
    current = config.get("current-context")
    user_name = next(
        (
            (c.get("context") or {}).get("user")
            for c in config.get("contexts") or []
            if isinstance(c, dict) and c.get("name") == current
        ),
        None,
    )
    for u in config.get("users") or []:
        if isinstance(u, dict) and u.get("name") == user_name:
            path = (u.get("user") or {}).get("tokenFile")
            if isinstance(path, str) and path:
                return kubeconfig.parent / path
    return None


class TokenFile:
    """`Bearer <token>` from a file, re-read when the last read is `max_age_s` old."""

    def __init__(
        self,
        path: Path,
        *,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()  # requests run in worker threads
        self._token = ""
        self._read_at: float | None = None

    def header(self) -> str:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.max_age_s:
                try:
                    token = self.path.read_text().strip()
                except OSError as err:
                    if not self._token:
                        raise Unavailable(f"tokenFile {self.path}: {err}") from err
                    token = ""
                if token:
                    self._token = token
                elif not self._token:
                    raise Unavailable(f"tokenFile {self.path}: empty")
                self._read_at = now
            return f"Bearer {self._token}"

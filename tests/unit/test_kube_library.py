"""klet.kube.library loads the `kubernetes` pieces klet uses without the rest (issue 42,
cluster-mode memory), and the library stays whole: a fresh interpreter importing
klet.kube.client holds none of requests_oauthlib, requests, oauthlib, pydantic,
dateutil, websocket, the ApiClient, the models or the subpackages klet does not use;
kube_config's names for the oidc auth-provider refresh reach the real OAuth2Session,
oauthlib error class and ApiClient at their first use, and the stand-ins are gone
from sys.modules and kubernetes.client afterwards; the package's own attributes
(`__version__`, `kubernetes.dynamic`, `kubernetes.utils.create_from_yaml`) are there
when asked for; a kubeconfig with an exec plugin still loads its token through the
library's loader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from klet.kube import KubeSettings
from klet.kube.client import KubeClient

from tests.harness.freshimports import loaded_after

NOT_LOADED = [
    "requests_oauthlib",
    "requests",
    "oauthlib",
    "pydantic",
    "dateutil",
    "websocket",
    "multiprocessing.pool",
    "kubernetes.client.api_client",
    "kubernetes.client.models",
    "kubernetes.dynamic",
    "kubernetes.stream",
    "kubernetes.leaderelection",
    "kubernetes.informer",
    "kubernetes.utils.create_from_yaml",
]


def test_the_client_loads_only_the_pieces_it_uses() -> None:
    """Imported, with a watch built and asked its return type (as Watch.stream asks)."""
    loaded = loaded_after(
        "import klet.kube.client as c\nw = c.RawWatch()\nw.get_return_type(lambda **_: None)",
        [*NOT_LOADED, "kubernetes.config.kube_config", "kubernetes.watch.watch"],
    )
    assert loaded == ["kubernetes.config.kube_config", "kubernetes.watch.watch"]


STAND_INS = """
import json, sys
import klet.kube.library
import kubernetes.client, kubernetes.config.kube_config as kc
from kubernetes.client import Configuration
left = [m for m in ("requests_oauthlib", "oauthlib", "oauthlib.oauth2") if m in sys.modules]
in_client = "ApiClient" in vars(kubernetes.client)
error = kc.oauthlib.oauth2.rfc6749.errors.InvalidClientIdError
session = kc.OAuth2Session(client_id="c")
api = kc.ApiClient(configuration=Configuration())
import kubernetes
print(json.dumps({
    "left": left,
    "in_client": in_client,
    "error": f"{error.__module__}.{error.__name__}",
    "session": type(session).__name__,
    "api": f"{type(api).__module__}.{type(api).__name__}",
    "same_api": kubernetes.client.ApiClient is type(api),
    "version": kubernetes.__version__,
    "dynamic": kubernetes.dynamic.__name__,
    "create_from_yaml": kubernetes.utils.create_from_yaml.__name__,
}))
"""


def test_the_deferred_names_reach_the_real_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", STAND_INS], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["left"] == []
    assert got["in_client"] is False
    assert got["error"] == "oauthlib.oauth2.rfc6749.errors.InvalidClientIdError"
    assert got["session"] == "OAuth2Session"
    assert got["api"] == "kubernetes.client.api_client.ApiClient"
    assert got["same_api"] is True
    assert got["version"].split(".")[0].isdigit()
    assert got["dynamic"] == "kubernetes.dynamic"
    assert got["create_from_yaml"] == "create_from_yaml"


async def test_an_exec_plugin_kubeconfig_is_loaded_by_the_library(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\necho '"
        + json.dumps(
            {
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {"token": "from-exec"},
            }
        )
        + "'\n"
    )
    plugin.chmod(0o755)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": str(plugin),
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    client = KubeClient(KubeSettings(kubeconfig=path))
    assert client.auth_headers() == {"Authorization": "Bearer from-exec"}
    assert client.host == "https://127.0.0.1:6443"
    await client.close()

"""What a standalone service loads: importing the five services' entry points, apps and
wiring (what `klet run <service>` imports before it builds its dependencies) loads
neither the Kubernetes client, nor FastAPI/pydantic, nor httpx (uvicorn and Starlette,
which serve every service's private port, are loaded by all of them); `klet up`
(which needs only the bus's ACL helpers) does not load the redis client.

Each costs 10-25 MB resident per process (issue 15's memory diet): the Kubernetes client
belongs to cluster mode (imported where the wiring builds it), FastAPI to the kubelet API
on --port, httpx to a manifest URL or an HTTP probe/hook. The status-reporter loads no
gRPC either: standalone it talks to no runtime. Only pod-source loads PyYAML at start
(manifests); the others read YAML only for a --config file. `klet up`, a supervisor that stays
resident beside its services, loads neither the image builder of klet.devstack (and its
HTTP client) nor the installed distributions' metadata unless it starts a private
runtime. A fresh interpreter does the imports, so modules the test process already holds
do not hide a regression.
"""

from __future__ import annotations

import json
import subprocess
import sys

SERVICES = ("pod_source", "syncloop", "status_reporter", "eviction", "image_gc")
LAZY = ("kubernetes", "fastapi", "pydantic", "httpx")

PROBE = """
import importlib, json, sys
for service in {services!r}:
    for part in ("__main__", "app", "wiring"):
        importlib.import_module(f"klet.{{service}}.{{part}}")
print(json.dumps(sorted({{m.partition(".")[0] for m in sys.modules}} & set({lazy!r}))))
"""


def test_standalone_services_do_not_import_the_cluster_or_api_libraries() -> None:
    code = PROBE.format(services=SERVICES, lazy=LAZY)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_standalone_status_reporter_does_not_import_grpc() -> None:
    code = PROBE.format(services=("status_reporter",), lazy=("grpc", "cri_api"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_only_pod_source_imports_yaml() -> None:
    """PyYAML is for manifests (pod-source) and a --config file, read only when given."""
    services = tuple(s for s in SERVICES if s != "pod_source")
    code = PROBE.format(services=services, lazy=("yaml",))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_probe_sees_an_eager_import() -> None:
    """The probe itself: a module that is imported shows up (the test above can fail)."""
    code = PROBE.format(services=(), lazy=LAZY).replace("print(", "import httpx\nprint(", 1)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["httpx"]


UP_LAZY = (
    "redis",
    "yaml",
    "grpc",
    "httpx",
    "klet.devstack.images",
    "klet.devstack.containerd",
    "klet.devstack.stack",
    "importlib.metadata",
)

UP_PROBE = """
import json, sys
{imports}
print(json.dumps(sorted(set(sys.modules) & set({lazy!r}))))
"""


def _up_loads(imports: str) -> list[str]:
    code = UP_PROBE.format(imports=imports, lazy=UP_LAZY)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_klet_up_imports_neither_clients_nor_the_image_builder() -> None:
    assert _up_loads("import klet.cli.main, klet.cli.up") == []


def test_the_up_probe_sees_the_devstack_when_it_is_used() -> None:
    """What `klet up` loads to start a private containerd: the probe above can fail."""
    loaded = _up_loads("import klet.cli.up\nfrom klet.devstack import DevStack")
    assert {"httpx", "klet.devstack.images", "klet.devstack.stack"} <= set(loaded)

"""docker-compose.yml and .env.example agree: the five services run `klet run <service>`
from one shared block (host network and PID namespace, privileged, no init (docker
ignores it in the host's PID namespace), restart policy, stop grace period, the same
flags and mounts, a health check through `klet healthcheck`), each with its own Redis
user and password file; the Redis has no network and no persistence; every variable the
compose file reads is documented in .env.example with the same default; the default
image tags are this version's; replicas of a service take any free port (0, overridable
per service) and each keeps its port file for its health check outside the shared bind
mounts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from klet.bus.acl import SERVICES

from tools.image.__main__ import version

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
# ${NAME}, ${NAME:-default}, ${NAME:?message}
VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}")


def compose() -> dict[str, Any]:
    """The compose file as docker-compose reads it with .env.example and a node name."""
    env = {**documented(), "KLET_NODE_NAME": "node-a"}
    text = VARIABLE.sub(lambda m: env[m.group(1)], COMPOSE.read_text())
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def documented() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name] = value
    return out


def test_every_variable_is_documented_with_its_default() -> None:
    env = documented()
    used = VARIABLE.findall(COMPOSE.read_text())
    assert {name for name, _, _ in used} == set(env)
    for name, kind, default in used:
        if kind == ":-":
            assert env[name] == default, f"{name}: .env.example {env[name]!r}, compose {default!r}"
    required = {name for name, kind, _ in used if kind == ":?"}
    assert required == {"KLET_NODE_NAME"}
    assert env["KLET_NODE_NAME"] == ""


def test_default_images_are_this_version() -> None:
    env = documented()
    assert env["KLET_IMAGE"] == f"klet:{version()}"
    assert env["KLET_REDIS_IMAGE"] == f"klet-redis:{version()}"


@pytest.mark.parametrize("service", SERVICES)
def test_service_runs_from_the_shared_block(service: str) -> None:
    spec = compose()["services"][service]
    assert spec["entrypoint"] == ["klet", "run", service]
    assert spec["healthcheck"]["test"] == ["CMD", "klet", "healthcheck", service]
    for key, value in {
        "network_mode": "host",
        "pid": "host",
        "privileged": True,
        "restart": "unless-stopped",
    }.items():
        assert spec[key] == value, key
    assert "init" not in spec  # a no-op with pid: host; the comment says why
    assert spec["stop_grace_period"]
    assert spec["environment"]["KLET_REDIS_USERNAME"] == f"klet-{service}@node-a"
    assert spec["environment"]["KLET_REDIS_PASSWORD_FILE"].endswith(f"/secrets/node-a/{service}")
    root = [v for v in spec["volumes"] if isinstance(v, dict)]
    assert root and root[0]["bind"]["propagation"] == "rshared"
    assert root[0]["source"] == root[0]["target"]
    for volume in spec["volumes"]:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
            assert source == target, f"{service}: {volume} is not a same-path bind"


def test_services_share_flags_and_mounts() -> None:
    specs = [compose()["services"][s] for s in SERVICES]
    for spec in specs[1:]:
        assert spec["command"] == specs[0]["command"]
        assert spec["volumes"] == specs[0]["volumes"]


def test_redis_has_no_network_and_no_persistence() -> None:
    redis = compose()["services"]["redis"]
    assert redis["network_mode"] == "none"
    assert "ports" not in redis
    argv = redis["command"]
    assert argv[argv.index("--port") + 1] == "0"
    assert argv[argv.index("--save") + 1] == ""
    assert argv[argv.index("--appendonly") + 1] == "no"
    assert argv[argv.index("--maxmemory") + 1] == "256mb"
    assert argv[argv.index("--maxmemory-policy") + 1] == "noeviction"
    assert redis["depends_on"]["bus-acl"]["condition"] == "service_completed_successfully"


PORT_VARIABLES = {
    "pod-source": "KLET_POD_SOURCE_PORT",
    "syncloop": "KLET_SYNCLOOP_PORT",
    "status-reporter": "KLET_STATUS_REPORTER_PORT",
    "eviction": "KLET_EVICTION_PORT",
    "image-gc": "KLET_IMAGE_GC_PORT",
}


@pytest.mark.parametrize("service", SERVICES)
def test_replicas_take_any_free_port_and_check_their_own(service: str) -> None:
    """`up --scale` must not collide on the host network: port 0 by default (still
    overridable per service), and a port file each replica keeps to itself."""
    text = COMPOSE.read_text()
    assert f"KLET_SERVICE_PORT: ${{{PORT_VARIABLES[service]}:-0}}" in text
    assert documented()[PORT_VARIABLES[service]] == "0"
    spec = compose()["services"][service]
    assert str(spec["environment"]["KLET_SERVICE_PORT"]) == "0"
    port_file = spec["environment"]["KLET_SERVICE_PORT_FILE"]
    assert port_file.startswith("/")
    targets = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in spec["volumes"]]
    for target in targets:
        shared = Path(target)
        assert shared != Path(port_file) and shared not in Path(port_file).parents, (
            f"{service}: {port_file} is under the bind mount {target}: replicas would share it"
        )
    assert "container_name" not in spec  # a fixed name would refuse a second replica
    assert "ports" not in spec  # host network: nothing to publish, nothing to collide

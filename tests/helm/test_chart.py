"""The chart helm/klet as rendered by the pinned helm, without a cluster.

`helm lint --strict` passes for every ci/*.yaml on Helm 4 and on Helm 3. In every
rendering each service workload runs as docker-compose.yml runs the service (host
network and PID namespace, privileged, the same flags, environment and same-path
mounts, the root dir with Bidirectional propagation, KLET_SERVICE_PORT=0 and a private
port file, `klet healthcheck <service>` probes), with the checksum of the rendered
configuration (which changes when kubeletConfig does), system-node-critical and
tolerations of every taint by default, of the kind its values choose; the bundled Redis
has the compose file's flags and no TCP port; the services get no ServiceAccount token
and nothing is bound to system:node or cluster-admin (rbac.create is refused, naming
why); the ServiceMonitor is rendered
only when enabled; the helm test pod runs on the klet node with a read-only view of its
Node and Lease; the schema refuses bad values with a message naming the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from klet.bus.acl import SERVICES
from klet.config import load_settings

from tests.harness.helmbin import CHART, CI_VALUES, helm, render, render_error
from tests.unit.test_compose_file import compose
from tools.image.__main__ import version

CI = {p.stem: p for p in CI_VALUES}
# A named node's services must be pinned to its host.
PINNED = "serviceDefaults.nodeSelector.kubernetes\\.io/hostname=host-a"
WORKLOAD_KINDS = {"DaemonSet", "Deployment"}
Doc = dict[str, Any]


def workloads(docs: list[Doc]) -> dict[str, Doc]:
    """Workloads by component (a service name or "redis")."""
    out = {}
    for d in docs:
        if d["kind"] in WORKLOAD_KINDS:
            out[d["metadata"]["labels"]["app.kubernetes.io/component"]] = d
    return out


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def container(workload: Doc) -> Doc:
    containers: list[Doc] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def mounts_of(workload: Doc) -> dict[str, tuple[Doc, Doc]]:
    """mountPath -> (volumeMount, volume) of the workload's one container."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container(workload)["volumeMounts"]}


def flag_names(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


# ---------------------------------------------------------------------------------------
# lint


@pytest.mark.parametrize("major", ["v4", "v3"])
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_lint_strict(major: str, values: Path) -> None:
    res = helm(major, "lint", "--strict", str(CHART), "-f", str(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout
    assert "[WARNING]" not in res.stdout and "[ERROR]" not in res.stdout


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version()  # the tag `make image` gives both images
    assert chart["kubeVersion"].startswith(">=")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "klet"
    assert values["redis"]["image"]["repository"] == "klet-redis"
    json.loads((CHART / "values.schema.json").read_text())


def test_kube_version_is_enforced() -> None:
    err = helm("v4", "template", "klet", str(CHART), "--kube-version", "1.27.0", check=False)
    assert err.returncode != 0
    assert "kubeVersion" in err.stderr


# ---------------------------------------------------------------------------------------
# every rendering: the node-agent invariants


@pytest.mark.parametrize("name", sorted(CI))
def test_every_workload_is_a_node_agent(name: str) -> None:
    docs = render([CI[name]])
    found = workloads(docs)
    assert set(found) - {"redis"} == set(enabled_services(name))
    for component, w in found.items():
        pod = w["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True, component
        assert pod["priorityClassName"] == "system-node-critical", component
        assert {"operator": "Exists"} in pod["tolerations"], component
        if component == "redis":
            assert "checksum/config" not in w["spec"]["template"]["metadata"].get(
                "annotations", {}
            )
            continue
        checksum = w["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert re.fullmatch(r"[0-9a-f]{64}", checksum), component
        assert pod["hostPID"] is True, component
        c = container(w)
        assert c["securityContext"]["privileged"] is True
        assert c["command"] == ["klet", "run", component]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["exec"]["command"] == ["klet", "healthcheck", component], probe
            assert c[probe]["timeoutSeconds"] >= 10, probe  # a Python start on a loaded node
        root_dir = "/var/lib/kubelet"
        mount, volume = mounts_of(w)[root_dir]
        assert mount["mountPropagation"] == "Bidirectional"
        assert volume["hostPath"] == {"path": root_dir, "type": "DirectoryOrCreate"}
        env = env_of(c)
        assert env["KLET_SERVICE_PORT"] == "0"
        port_file = Path(env["KLET_SERVICE_PORT_FILE"])
        for path in mounts_of(w):
            assert Path(path) not in port_file.parents, f"{component}: port file under {path}"


@pytest.mark.parametrize("service", SERVICES)
def test_service_runs_as_compose_runs_it(service: str) -> None:
    """Same flags, environment and same-path host mounts as docker-compose.yml with its
    defaults; the chart adds --node-ip (the host's IP from the downward API)."""
    spec = compose()["services"][service]  # rendered for node "node-a"
    sets = ["node.name=node-a", "credentials.existingSecret=node-a-kubeconfig", PINNED]
    w = workloads(render(sets=sets))[service]
    c = container(w)
    assert sorted(flag_names(c["args"])) == sorted([*flag_names(spec["command"]), "--node-ip"])
    by_flag = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in c["args"]}
    for flag in spec["command"]:
        name, _, value = flag.partition("=")
        if name not in ("--config", "--kubeconfig", "--hostname-override"):
            assert by_flag[name] == value, name
    assert by_flag["--hostname-override"] == "$(NODE_NAME)"
    assert by_flag["--kubeconfig"] == "/etc/klet/credentials/kubeconfig"
    env = {k: str(v).replace("$(NODE_NAME)", "node-a") for k, v in env_of(c).items()}
    for name, value in spec["environment"].items():
        assert env[name] == str(value), name
    mounts = mounts_of(w)
    for volume in spec["volumes"]:
        path = volume["target"] if isinstance(volume, dict) else volume.split(":")[1]
        if path in ("/etc/klet", "/etc/resolv.conf"):
            continue  # the ConfigMap at /etc/klet/config; the host's resolver file beside
        mount, source = mounts[path]
        assert source["hostPath"]["path"] == path, path
        assert mount.get("readOnly", False) == (
            isinstance(volume, str) and volume.endswith(":ro")
        ), path
    assert mounts["/etc/klet/host/resolv.conf"][1]["hostPath"]["path"] == "/etc/resolv.conf"


def enabled_services(name: str) -> list[str]:
    services = (yaml.safe_load(CI[name].read_text()) or {}).get("services") or {}
    return [s for s in SERVICES if (services.get(s) or {}).get("enabled", True)]


@pytest.mark.parametrize(
    ("name", "service"),
    [
        (name, service)
        for name in ("pinned-values", "secret-values", "external-redis-values")
        for service in enabled_services(name)
    ],
)
def test_klet_accepts_what_is_rendered(name: str, service: str, tmp_path: Path) -> None:
    """The rendered flags, environment and KubeletConfiguration load as the service
    would load them (klet.config.load_settings); the files the pod mounts are stood in
    for by files under tmp_path."""
    docs = render([CI[name]])
    c = container(workloads(docs)[service])
    config = tmp_path / "kubelet-config.yaml"
    config.write_text(yaml.safe_dump(kubelet_config(docs)))
    stand_ins = {"/etc/klet/config/kubelet-config.yaml": str(config)}
    env = env_of(c)
    # A value, or what the downward API gives: the host's name and IP.
    node = env["NODE_NAME"] if isinstance(env["NODE_NAME"], str) else "host-node"
    ip = env["NODE_IP"] if isinstance(env["NODE_IP"], str) else "10.0.0.9"

    def expand(text: str) -> str:
        text = text.replace("$(NODE_NAME)", node).replace("$(NODE_IP)", ip)
        for path, stand_in in stand_ins.items():
            text = text.replace(path, stand_in)
        return text

    for variable in ("KLET_REDIS_PASSWORD_FILE",):
        if variable in env:
            secret = tmp_path / variable
            secret.write_text("s3cret\n")
            stand_ins[expand(env[variable])] = str(secret)
    settings = load_settings(
        [expand(a) for a in c["args"]],
        env={k: expand(v) for k, v in env.items() if isinstance(v, str)},
        service=service,
    )
    assert settings.klet.node_name == node
    assert settings.klet.service_port == 0
    assert settings.klet.redis_url == env["KLET_REDIS_URL"]
    assert settings.kubelet.port == kubelet_config(docs)["port"]


def test_redis_runs_as_compose_runs_it() -> None:
    spec = compose()["services"]
    w = workloads(render(sets=["node.name=node-a", PINNED]))["redis"]
    pod = w["spec"]["template"]["spec"]
    c = container(w)
    assert c["args"] == spec["redis"]["command"]
    assert "ports" not in c
    (init,) = pod["initContainers"]
    assert init["command"] == [
        a.replace("node-a", "$(NODE_NAME)") for a in spec["bus-acl"]["entrypoint"]
    ]
    assert env_of(init)["NODE_NAME"] == "node-a"
    assert pod["automountServiceAccountToken"] is False
    assert "securityContext" not in c  # not privileged: it only needs its two host dirs


def test_node_from_the_downward_api_or_the_values() -> None:
    w = workloads(render())["syncloop"]
    env = env_of(container(w))
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NODE_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    env = env_of(
        container(workloads(render(sets=["node.name=n1", "node.ip=10.1.2.3", PINNED]))["eviction"])
    )
    assert (env["NODE_NAME"], env["NODE_IP"]) == ("n1", "10.1.2.3")


def kubelet_config(docs: list[Doc]) -> Doc:
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")]
    cfg: Doc = yaml.safe_load(cm["data"]["kubelet-config.yaml"])
    return cfg


def test_node_labels_and_taints() -> None:
    docs = render([CI["pinned-values"]], ["node.labels.a\\.io/z=x1"])
    args = container(workloads(docs)["status-reporter"])["args"]
    assert "--node-labels=a.io/z=x1,klet.dev/pool=test" in args
    cfg = kubelet_config(docs)
    assert cfg["registerWithTaints"] == [
        {"key": "klet.dev/test", "value": "true", "effect": "NoSchedule"}
    ]
    assert cfg["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert cfg["kind"] == "KubeletConfiguration"
    assert cfg["maxPods"] == 50
    assert "registerWithTaints" not in kubelet_config(render())
    assert not [a for a in container(workloads(render())["syncloop"])["args"] if "labels" in a]


def checksums(docs: list[Doc]) -> dict[str, str]:
    return {
        name: w["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for name, w in workloads(docs).items()
        if name != "redis"
    }


def test_kubelet_config_change_rolls_every_service_but_not_redis() -> None:
    before = checksums(render([CI["pinned-values"]]))
    assert before == checksums(render([CI["pinned-values"]], ["logFormat=json"]))
    redis_before = workloads(render([CI["pinned-values"]]))["redis"]["spec"]["template"]
    after_docs = render([CI["pinned-values"]], ["kubeletConfig.maxPods=60"])
    after = checksums(after_docs)
    assert workloads(after_docs)["redis"]["spec"]["template"] == redis_before
    assert set(after) == set(before) == set(SERVICES)
    for name in before:
        assert after[name] != before[name], name
    assert len(set(before.values())) == 1


def test_resolv_conf_is_set_through_paths() -> None:
    cfg = kubelet_config(render(sets=["paths.resolvConf=/run/systemd/resolve/resolv.conf"]))
    assert cfg["resolvConf"] == "/etc/klet/host/resolv.conf"
    err = render_error(sets=["kubeletConfig.resolvConf=/x"])
    assert "kubeletConfig.resolvConf: set paths.resolvConf" in err


# ---------------------------------------------------------------------------------------
# kinds


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("default-values", dict.fromkeys([*SERVICES, "redis"], "DaemonSet")),
        (
            "pinned-values",
            {**dict.fromkeys([*SERVICES, "redis"], "DaemonSet"), "syncloop": "Deployment"},
        ),
        ("secret-values", dict.fromkeys([*SERVICES, "redis"], "Deployment")),
    ],
)
def test_kind_per_service(name: str, kinds: dict[str, str]) -> None:
    found = workloads(render([CI[name]]))
    assert {n: w["kind"] for n, w in found.items()} == kinds
    for w in found.values():
        if w["kind"] == "Deployment":
            assert w["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        else:
            assert "replicas" not in w["spec"]


def test_replicas_and_strategies() -> None:
    found = workloads(
        render(
            [CI["pinned-values"]],
            [
                "services.eviction.updateStrategy.rollingUpdate.maxUnavailable=2",
                "services.syncloop.updateStrategy.type=Recreate",
                "services.syncloop.podAnnotations.a=b",
                "services.image-gc.tolerations[0].key=dedicated",
                "services.image-gc.tolerations[0].operator=Exists",
            ],
        )
    )
    assert found["syncloop"]["spec"]["replicas"] == 2
    assert found["syncloop"]["spec"]["strategy"] == {"type": "Recreate"}
    assert found["syncloop"]["spec"]["template"]["metadata"]["annotations"]["a"] == "b"
    assert found["eviction"]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 2
    assert container(found["syncloop"])["args"][-1] == "--v=2"
    # A service's own key replaces the default whole.
    assert found["image-gc"]["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Exists"}
    ]
    assert found["eviction"]["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert found["redis"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/hostname": "host-1"
    }


def test_services_can_be_left_out() -> None:
    only = workloads(
        render(sets=["serviceDefaults.enabled=false", "services.syncloop.enabled=true"])
    )
    assert set(only) == {"syncloop", "redis"}


def test_a_deployment_must_be_pinned_to_one_node() -> None:
    err = render_error(sets=["services.syncloop.kind=Deployment"])
    assert "services.syncloop: a Deployment needs a nodeSelector or affinity" in err
    err = render_error(sets=["redis.kind=Deployment"])
    assert "redis: a Deployment needs a nodeSelector" in err
    err = render_error(sets=["node.name=n1"])
    assert "services.pod-source: node.name names one node: pin the service" in err
    pin_each = [f"services.{s}.nodeSelector.kubernetes\\.io/hostname=h" for s in SERVICES]
    err = render_error(sets=["node.name=n1", *pin_each])
    assert "redis: node.name names one node: pin the Redis" in err
    assert workloads(render(sets=["node.name=n1", *pin_each, "redis.nodeSelector.a=b"]))


# ---------------------------------------------------------------------------------------
# credentials and RBAC


def bindings(docs: list[Doc]) -> list[Doc]:
    return of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding")


@pytest.mark.parametrize("name", sorted(CI))
def test_never_cluster_admin(name: str) -> None:
    docs = render([CI[name]])
    for b in bindings(docs):
        assert b["roleRef"]["name"] != "cluster-admin", b["metadata"]["name"]
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], role
            assert set(rule["verbs"]) <= {"get"}, role  # the test pod's only role


@pytest.mark.parametrize("name", sorted(CI))
def test_no_service_account_token_and_no_binding_to_system_node(name: str) -> None:
    docs = render([CI[name]])
    assert not [b for b in bindings(docs) if b["roleRef"]["name"] == "system:node"], name
    for w in workloads(docs).values():
        pod = w["spec"]["template"]["spec"]
        assert "serviceAccountName" not in pod
        assert pod["automountServiceAccountToken"] is False


def test_rbac_create_is_refused_naming_why() -> None:
    err = render_error(sets=["rbac.create=true"])
    assert "rbac.create was removed" in err
    assert "Node authorizer" in err and "credentials.existingSecret" in err
    assert render(sets=["rbac.create=false"]) == render()


def test_existing_secret_credentials() -> None:
    docs = render([CI["secret-values"]])
    for service in SERVICES:
        w = workloads(docs)[service]
        assert "--kubeconfig=/etc/klet/credentials/kubeconfig" in container(w)["args"]
        mount, volume = mounts_of(w)["/etc/klet/credentials"]
        assert mount["readOnly"] is True
        assert volume["secret"]["secretName"] == "klet-node-2-kubeconfig"


def test_standalone_has_no_kubeconfig() -> None:
    for w in workloads(render()).values():
        assert not [a for a in container(w).get("args", []) if a.startswith("--kubeconfig")]


# ---------------------------------------------------------------------------------------
# Redis


def test_external_redis() -> None:
    docs = render([CI["external-redis-values"]])
    found = workloads(docs)
    assert "redis" not in found and "image-gc" not in found
    for service in set(SERVICES) - {"image-gc"}:
        w = found[service]
        env = env_of(container(w))
        assert env["KLET_REDIS_URL"] == "rediss://redis.example:6380"
        assert env["KLET_REDIS_USERNAME"] == "klet"
        assert env["KLET_REDIS_PASSWORD_FILE"] == "/etc/klet/redis/password"
        assert mounts_of(w)["/etc/klet/redis"][1]["secret"]["secretName"] == "klet-redis"
        assert not [p for p in mounts_of(w) if p.startswith("/var/lib/klet/bus")]


def test_external_redis_on_a_unix_socket_of_the_host() -> None:
    docs = render(sets=["redis.enabled=false", "externalRedis.url=unix:///run/bus/redis.sock"])
    w = workloads(docs)["syncloop"]
    assert env_of(container(w))["KLET_REDIS_URL"] == "unix:///run/bus/redis.sock"
    assert "KLET_REDIS_PASSWORD_FILE" not in env_of(container(w))
    mount, volume = mounts_of(w)["/run/bus"]
    assert volume["hostPath"] == {"path": "/run/bus", "type": "DirectoryOrCreate"}
    assert "/run/klet/redis" not in mounts_of(w)


def test_bundled_redis_is_on_a_unix_socket_with_per_service_users() -> None:
    w = workloads(render())["syncloop"]
    env = env_of(container(w))
    assert env["KLET_REDIS_URL"] == "unix:///run/klet/redis/redis.sock"
    assert env["KLET_REDIS_USERNAME"] == "klet-syncloop@$(NODE_NAME)"
    assert env["KLET_REDIS_PASSWORD_FILE"] == "/var/lib/klet/bus/secrets/$(NODE_NAME)/syncloop"
    names = [e["name"] for e in container(w)["env"]]
    assert names.index("NODE_NAME") < names.index("KLET_REDIS_USERNAME")  # $(NODE_NAME) expands


# ---------------------------------------------------------------------------------------
# metrics and helm test


def test_service_monitor_only_when_enabled() -> None:
    for name in ("default-values", "pinned-values", "external-redis-values"):
        assert not of_kind(render([CI[name]]), "ServiceMonitor"), name
    docs = render([CI["secret-values"]])
    (monitor,) = of_kind(docs, "ServiceMonitor")
    (service,) = of_kind(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == (
        "https-metrics",
        "https",
        "/metrics",
    )
    assert service["spec"]["ports"][0]["port"] == 10250
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "status-reporter"
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert service["metadata"]["labels"][key] == value
    # Prometheus verifies the certificate before it sends its token (no skip by default).
    assert endpoint["tlsConfig"] == {
        "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    }
    skip = render(
        [CI["secret-values"]], ["metrics.serviceMonitor.tlsConfig.insecureSkipVerify=true"]
    )
    (monitor,) = of_kind(skip, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["tlsConfig"]["insecureSkipVerify"] is True


def test_helm_test_pod_checks_the_node_from_the_node() -> None:
    docs = render([CI["pinned-values"]])
    (pod,) = of_kind(docs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "klet-node-1"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["hostNetwork"] is True
    assert spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["command"][:3] == ["klet", "check-node", "--node=klet-node-1"]
    (role,) = of_kind(docs, "ClusterRole")
    assert {(r["resources"][0], tuple(r["resourceNames"])) for r in role["rules"]} == {
        ("nodes", ("klet-node-1",)),
        ("leases", ("klet-node-1",)),
    }
    (binding,) = [b for b in bindings(docs) if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]
    # The test's RBAC objects are release objects (helm uninstall removes them), not hooks.
    for d in of_kind(docs, "ServiceAccount") + of_kind(docs, "ClusterRole"):
        assert "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
    assert not of_kind(render(), "Pod")  # no node name: no one node to check
    assert not of_kind(render([CI["pinned-values"]], ["tests.enabled=false"]), "Pod")


# ---------------------------------------------------------------------------------------
# the schema


@pytest.mark.parametrize("major", ["v4", "v3"])
@pytest.mark.parametrize(
    ("sets", "field", "why"),
    [
        (["services.syncloop.kind=StatefulSet"], "/services/syncloop/kind", "DaemonSet"),
        (["services.eviction.replicas=-1"], "/services/eviction/replicas", "minimum"),
        (["services.synclop.kind=Deployment"], "/services", "synclop"),
        (["serviceDefaults.replicas=two"], "/serviceDefaults/replicas", "integer"),
        (["paths.rootDir=var/lib/kubelet"], "/paths/rootDir", "^/"),
        (
            ["node.taints[0].key=k", "node.taints[0].effect=Sometimes"],
            "/node/taints/0/effect",
            "NoSchedule",
        ),
        (["redis.enabled=false"], "/externalRedis", "url"),
        (
            ["redis.enabled=false", "externalRedis.url=redis://r:6379"],
            "/externalRedis/passwordSecret",
            "name",
        ),
        (["externalRedis.url=http://r"], "/externalRedis/url", "redis"),
        (["kubeletConfig.port=0"], "/kubeletConfig/port", "minimum"),
    ],
)
def test_schema_names_the_bad_field(major: str, sets: list[str], field: str, why: str) -> None:
    err = render_error(sets=sets, major=major)
    assert "values don't meet the specifications of the schema" in err
    assert field in err and why in err, err


def test_a_tcp_redis_with_a_password_secret_is_accepted() -> None:
    render(
        sets=[
            "redis.enabled=false",
            "externalRedis.url=redis://r:6379",
            "externalRedis.passwordSecret.name=s",
        ]
    )
    render(sets=["redis.enabled=false", "externalRedis.url=unix:///run/r.sock"])

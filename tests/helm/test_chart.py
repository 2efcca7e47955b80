"""The chart helm/klet as rendered by the pinned helm, without a cluster.

`helm lint --strict` passes for every ci/*.yaml on Helm 4 and on Helm 3. In every
rendering each service workload runs as docker-compose.yml runs the service (host
network, the same flags, environment and same-path mounts, KLET_SERVICE_PORT=0 and a
private port file, `klet healthcheck <service>` probes) and gets what the compose file
gives it (tests/unit/test_compose_file.confinement): only syncloop privileged, in the
host's PID namespace and with the root dir Bidirectional; the others with every
capability dropped but eviction's DAC_READ_SEARCH, no privilege escalation, a read-only
root filesystem, the same mounts read-only or writable; the runtime's socket for
syncloop alone, and beside status-reporter, eviction and image-gc a confined
`cri-proxy` container serving that service its CRI allow-list on a memory emptyDir of
their pod; the node credentials only for
pod-source, syncloop and status-reporter; each service's bus password alone, from the
directory the bus set-up copies it to, after an init container waits for it. Each
workload carries the checksum of the rendered configuration (which changes when
kubeletConfig does), system-node-critical and tolerations of every taint by default, and
is of the kind its values choose; status-reporter has a memory limit. The bundled Redis
has the compose file's flags, no TCP port, its user, no capability, a read-only root
filesystem and its three bus files only; its init container may only chown. No pod
template of any rendering mounts a Secret but the node credentials, so no node-scheduled
pod gets an external Redis's admin password: `externalRedis.admin` is refused naming
what to do instead, and with `externalRedis.perNodeUsers` (users an operator provisioned
with `klet bus-acl --apply`) each service reads its own password from its own
directory; one shared user is refused for a DaemonSet. A bootstrap-token join
(credentials.bootstrap) gives the bootstrap Secret, the TLS bootstrap flags and a
writable certificate directory of its own to the three services that call the
apiserver alone, and a ready kubeconfig with it, rotation without it or a certificate
directory inside or around another mounted path are refused by name. The services get
no ServiceAccount token and nothing is bound to system:node or cluster-admin
(rbac.create is refused, naming why); the ServiceMonitor is rendered only when
enabled; the helm test pod runs on the klet node with a read-only view of its Node and
Lease; the schema refuses bad values with a message naming the field.
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
from tests.unit.test_compose_file import (
    STANDALONE_KUBECONFIG,
    compose,
    confinement,
    documented,
    volume_targets,
)
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


READERS = ("status-reporter", "eviction", "image-gc")
"""The services that reach the runtime through a cri-proxy container in their pod."""


def container(workload: Doc) -> Doc:
    """The workload's main container: its only one, or beside it the reader's
    cri-proxy."""
    containers: list[Doc] = workload["spec"]["template"]["spec"]["containers"]
    component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
    names = [c["name"] for c in containers]
    assert names == ([component, "cri-proxy"] if component in READERS else names[:1]), names
    return containers[0]


def env_of(c: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def mounts_of(workload: Doc, c: Doc | None = None) -> dict[str, tuple[Doc, Doc]]:
    """mountPath -> (volumeMount, volume) of the workload's one container (or `c`)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    c = container(workload) if c is None else c
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in c["volumeMounts"]}


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
    assert set(found) - {"redis", "bus-users"} == set(enabled_services(name))
    for component, w in found.items():
        pod = w["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True, component
        assert pod["priorityClassName"] == "system-node-critical", component
        assert {"operator": "Exists"} in pod["tolerations"], component
        if component in ("redis", "bus-users"):
            assert "checksum/config" not in w["spec"]["template"]["metadata"].get("annotations", {})
            assert "hostPID" not in pod, component
            continue
        checksum = w["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert re.fullmatch(r"[0-9a-f]{64}", checksum), component
        assert pod.get("hostPID", False) is (component == "syncloop"), component
        c = container(w)
        assert c["command"] == ["klet", "run", component]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["exec"]["command"] == ["klet", "healthcheck", component], probe
            assert c[probe]["timeoutSeconds"] >= 10, probe  # a Python start on a loaded node
        env = env_of(c)
        assert env["KLET_SERVICE_PORT"] == "0"
        port_file = Path(env["KLET_SERVICE_PORT_FILE"])
        for path, (_, volume) in mounts_of(w).items():
            if "emptyDir" not in volume:  # a host path replicas would share
                assert Path(path) not in port_file.parents, f"{component}: port file under {path}"


# Where the chart mounts what the compose file binds elsewhere: the ConfigMap, the host's
# resolver file beside the pod's own, the service's password directory, the kubeconfig
# (in the credentials Secret, not in the kubernetes dir; only pod-source reads static
# pods from there).
CHART_PATH = {
    "/etc/klet": "/etc/klet/config",
    "/etc/resolv.conf": "/etc/klet/host/resolv.conf",
    "/etc/klet/bus/password": "/etc/klet/bus",
}


STATIC_POD_PATH = "/etc/kubernetes/manifests"
"""The chart's kubeletConfig.staticPodPath: pod-source mounts it, as compose's
pod-source mounts KLET_STATIC_POD_PATH (the same default)."""


def chart_path(service: str, compose_target: str) -> str:
    if compose_target == documented()["KLET_KUBERNETES_DIR"]:
        return STATIC_POD_PATH if service == "pod-source" else "/etc/klet/credentials"
    if service == "pod-source" and compose_target == STANDALONE_KUBECONFIG:
        # compose's pod-source mounts the kubeconfig file alone (/dev/null standalone,
        # as .env.example's default is); the chart's, the credentials Secret.
        return "/etc/klet/credentials"
    return CHART_PATH.get(compose_target, compose_target)


def test_each_service_mounts_only_its_part_of_the_run_dir() -> None:
    """As in docker-compose.yml: each service's pod mounts, of paths.runDir (set to
    another path here, so nothing is the default by chance), its own lease slots'
    directory and its own port files' directory, each a hostPath of that path; each gRPC
    server's socket directory in its own pod (writable) and, read-only, in its callers'
    (eviction: syncloop's and image-gc's; image-gc sees no other's);
    every port file read-only in status-reporter's alone; all of it in syncloop's."""
    run = "/run/klet-x"
    sets = ["node.name=node-a", PINNED, f"paths.runDir={run}"]
    found = {}
    for service, w in workloads(render(sets=sets)).items():
        if service == "redis":
            continue
        found[service] = {}
        for path, (m, volume) in mounts_of(w).items():
            if path == run or path.startswith(f"{run}/"):
                assert volume["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}, path
                found[service][path.removeprefix(run)] = not m.get("readOnly", False)
    assert found == {
        "pod-source": {"/leases/pod-source": True, "/ports/pod-source": True},
        "syncloop": {"": True},
        "status-reporter": {
            "/leases/status-reporter": True,
            "/ports": False,
            "/ports/status-reporter": True,
        },
        "eviction": {
            "/leases/eviction": True,
            "/grpc/eviction": True,
            "/grpc/syncloop": False,
            "/grpc/image-gc": False,
            "/ports/eviction": True,
        },
        "image-gc": {"/leases/image-gc": True, "/grpc/image-gc": True, "/ports/image-gc": True},
    }


@pytest.mark.parametrize("service", SERVICES)
def test_service_runs_as_compose_runs_it(service: str) -> None:
    """Same flags, environment, privileges and mounts as docker-compose.yml with its
    defaults (each read-only or writable as there, from the same host path); the chart
    adds --node-ip (the host's IP from the downward API), and a memory-backed /tmp for
    the confined services' port file."""
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
    env = {k: str(v).replace("$(NODE_NAME)", "node-a") for k, v in env_of(c).items()}
    for name, value in spec["environment"].items():
        assert env[name] == str(value), name

    want = confinement(service, {**documented(), "KLET_NODE_NAME": "node-a"})
    assert volume_targets(spec) == want.mounts
    mounts = mounts_of(w)
    expected = {chart_path(service, target): rw for target, rw in want.mounts.items()}
    if not want.privileged:
        expected["/tmp"] = True
    if want.kubeconfig:
        expected["/etc/klet/credentials"] = False
    assert {path: not m.get("readOnly", False) for path, (m, _) in mounts.items()} == expected
    for target in want.mounts:
        m, volume = mounts[chart_path(service, target)]
        if "hostPath" in volume and target not in CHART_PATH:
            assert volume["hostPath"]["path"] == chart_path(service, target), target
    assert mounts["/etc/klet/host/resolv.conf" if service == "syncloop" else "/etc/klet/config"]
    if service == "syncloop":
        assert mounts["/etc/klet/host/resolv.conf"][1]["hostPath"]["path"] == "/etc/resolv.conf"
    root = mounts.get("/var/lib/kubelet")
    if root is not None:
        propagation = "Bidirectional" if want.privileged else "HostToContainer"
        assert root[0]["mountPropagation"] == propagation
    assert by_flag.get("--kubeconfig") == (
        "/etc/klet/credentials/kubeconfig" if want.kubeconfig else None
    )


@pytest.mark.parametrize("service", SERVICES)
def test_each_container_gets_only_what_it_uses(service: str) -> None:
    """The compose file's privileges (tests/unit/test_compose_file.confinement) as a
    securityContext: privileged and the host's PID namespace for syncloop alone; for the
    others every capability dropped but the ones named, no privilege escalation, a
    read-only root filesystem and the runtime's default seccomp profile."""
    want = confinement(service, {**documented(), "KLET_NODE_NAME": "node-a"})
    w = workloads(render())[service]
    pod = w["spec"]["template"]["spec"]
    context = container(w)["securityContext"]
    assert pod.get("hostPID", False) is want.host_pid
    if want.privileged:
        assert context == {"privileged": True}
        return
    assert context == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {
            "drop": ["ALL"],
            **({"add": sorted(want.capabilities)} if want.capabilities else {}),
        },
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert tmp["emptyDir"]["medium"] == "Memory"


def enabled_services(name: str) -> list[str]:
    services = (yaml.safe_load(CI[name].read_text()) or {}).get("services") or {}
    return [s for s in SERVICES if (services.get(s) or {}).get("enabled", True)]


@pytest.mark.parametrize(
    ("name", "service"),
    [
        (name, service)
        for name in ("pinned-values", "secret-values", "external-redis-values", "bootstrap-values")
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
    """The compose file's Redis: the same flags and environment of klet-redis-server, its
    user and group, no capability, a read-only root filesystem, its three bus files
    read-only (no service password); the init container runs the compose file's bus-acl
    step (`$$` is compose's `$`) as root that may only chown, then copies each
    service's password to the directory that service mounts."""
    spec = compose()["services"]
    bus = documented()["KLET_BUS_DIR"]
    w = workloads(render(sets=["node.name=node-a", PINNED]))["redis"]
    pod = w["spec"]["template"]["spec"]
    c = container(w)
    assert c["args"] == spec["redis"]["command"]
    assert env_of(c) == spec["redis"]["environment"]
    assert "ports" not in c
    assert pod["automountServiceAccountToken"] is False
    assert c["securityContext"] == {
        "runAsUser": 6379,
        "runAsGroup": 6379,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["redis"]["user"] == "6379:6379"
    mounts = mounts_of(w)
    assert {p: not m.get("readOnly", False) for p, (m, _) in mounts.items()} == volume_targets(
        spec["redis"]
    )
    for name in ("users.acl", "functions.lua", "admin-password"):
        m, volume = mounts[f"{bus}/{name}"]
        assert (m["subPath"], volume["hostPath"]["path"]) == (name, bus)
    assert c["readinessProbe"]["exec"]["command"] == spec["redis"]["healthcheck"]["test"][1:]

    (init,) = pod["initContainers"]
    step = spec["bus-acl"]
    assert init["command"][:2] == step["entrypoint"][:2]
    script = init["command"][2]
    assert script.startswith(step["entrypoint"][2].replace("$$", "$"))
    assert 'cp "$BUS_DIR/secrets/$NODE_NAME/$s" "$BUS_DIR/services/$s/' in script
    env = env_of(init)
    assert env["NODE_NAME"] == "node-a"
    for name, value in step["environment"].items():
        if name != "NODE_NAME":
            assert env[name] == str(value), name
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert set(mounts_of(w, init)) == set(volume_targets(step))


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


def test_credentials_only_where_the_apiserver_is_called() -> None:
    """The node credentials (a kubeconfig and the files it names) go to pod-source,
    syncloop and status-reporter; eviction and image-gc never call the apiserver and get
    neither the Secret nor --kubeconfig."""
    docs = render([CI["secret-values"]])
    callers = {"pod-source", "syncloop", "status-reporter"}
    for service in SERVICES:
        w = workloads(docs)[service]
        args = container(w)["args"]
        found = mounts_of(w).get("/etc/klet/credentials")
        volumes = [v for v in w["spec"]["template"]["spec"]["volumes"] if "secret" in v]
        if service in callers:
            assert "--kubeconfig=/etc/klet/credentials/kubeconfig" in args
            assert found is not None and found[0]["readOnly"] is True
            assert found[1]["secret"]["secretName"] == "klet-node-2-kubeconfig"
        else:
            assert not [a for a in args if a.startswith("--kubeconfig")], service
            assert found is None and not volumes, service


def test_standalone_has_no_kubeconfig() -> None:
    for w in workloads(render()).values():
        assert not [a for a in container(w).get("args", []) if a.startswith("--kubeconfig")]


BOOTSTRAP_DIR = "/etc/klet/bootstrap"
CERT_DIR = "/var/lib/klet/pki"
"""credentials.bootstrap.certDir's default: not under the root dir eviction reads."""


def host_paths(w: Doc) -> dict[str, tuple[str, bool]]:
    """Host path -> (mount path, writable) of the workload's container's hostPath mounts."""
    return {
        volume["hostPath"]["path"]: (path, not m.get("readOnly", False))
        for path, (m, volume) in mounts_of(w).items()
        if "hostPath" in volume
    }


def test_bootstrap_token_join(tmp_path: Path) -> None:
    """credentials.bootstrap: pod-source, syncloop and status-reporter get the certificate
    directory writable at the same host path (where the first to start writes the
    kubeconfig they all read) and --kubeconfig naming it; the bootstrap Secret is mounted
    into a `tls-bootstrap` init container alone (`klet bootstrap <service>` with the
    service's flags and --bootstrap-kubeconfig, confined, loadable as the service would
    load them), never into the service's own container, so the token is not on the node
    for the pod's life. Eviction and image-gc get neither, and no host path they mount
    holds the certificate directory. Every container keeps its securityContext and its
    other mounts; kubeletConfig.rotateCertificates reaches the KubeletConfiguration."""
    docs = render([CI["bootstrap-values"]])
    plain = workloads(render())
    callers = {"pod-source", "syncloop", "status-reporter"}
    kubeconfig = f"{CERT_DIR}/kubelet.conf"
    assert kubelet_config(docs)["rotateCertificates"] is True
    for service, w in workloads(docs).items():
        if service == "redis":
            continue
        c = container(w)
        assert c["securityContext"] == container(plain[service])["securityContext"], service
        by_flag = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in c["args"] if "=" in a}
        assert by_flag["--cert-dir"] == CERT_DIR, service
        mounts = mounts_of(w)
        assert "/etc/klet/credentials" not in mounts, service
        hosts = host_paths(w)
        before = {
            h: m for h, m in host_paths(plain[service]).items() if h != "/var/lib/kubelet/pki"
        }
        if service in callers:
            assert by_flag["--kubeconfig"] == kubeconfig
            assert "--bootstrap-kubeconfig" not in by_flag, service
            assert BOOTSTRAP_DIR not in mounts, service  # the service's container: no token
            pod = w["spec"]["template"]["spec"]
            init = next(i for i in pod["initContainers"] if i["name"] == "tls-bootstrap")
            assert pod["initContainers"][0] is init
            assert init["command"] == ["klet", "bootstrap", service]
            assert init["securityContext"] == container(plain["eviction"])["securityContext"] | {
                "capabilities": {"drop": ["ALL"]}
            }
            init_flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in init["args"]}
            assert init_flags["--bootstrap-kubeconfig"] == (
                f"{BOOTSTRAP_DIR}/bootstrap-kubelet.conf"
            )
            assert init_flags["--kubeconfig"] == kubeconfig
            assert init_flags["--cert-dir"] == CERT_DIR
            init_mounts = mounts_of(w, init)
            assert set(init_mounts) == {"/etc/klet/config", BOOTSTRAP_DIR, CERT_DIR}
            m, volume = init_mounts[BOOTSTRAP_DIR]
            assert m["readOnly"] is True
            assert volume["secret"] == {"secretName": "klet-bootstrap", "optional": True}
            config = tmp_path / "kubelet-config.yaml"
            config.write_text(yaml.safe_dump(kubelet_config(docs)))
            argv = [
                a.replace("/etc/klet/config/kubelet-config.yaml", str(config))
                .replace("$(NODE_NAME)", "node-b")
                .replace("$(NODE_IP)", "10.0.0.9")
                for a in init["args"]
            ]
            settings = load_settings(argv, env={}, service=service)
            assert settings.klet.bootstrap_kubeconfig == Path(
                f"{BOOTSTRAP_DIR}/bootstrap-kubelet.conf"
            )
            m, volume = mounts[CERT_DIR]
            assert not m.get("readOnly", False) and "mountPropagation" not in m, service
            assert volume["hostPath"] == {"path": CERT_DIR, "type": "DirectoryOrCreate"}
            assert hosts == {**before, CERT_DIR: (CERT_DIR, True)}, service
        else:
            assert not {"--kubeconfig", "--bootstrap-kubeconfig"} & set(by_flag), service
            secrets = [v for v in w["spec"]["template"]["spec"]["volumes"] if "secret" in v]
            assert not secrets and BOOTSTRAP_DIR not in mounts, service
            assert hosts == before, service
            for host in hosts:
                assert not Path(CERT_DIR).is_relative_to(host), (service, host)


@pytest.mark.parametrize(
    ("sets", "owners", "cert_dir"),
    [
        ([], {"status-reporter"}, CERT_DIR),
        (["paths.certDir=/srv/pki"], {"status-reporter"}, "/srv/pki"),
        (
            ["credentials.bootstrap.existingSecret=klet-bootstrap"],
            {"pod-source", "syncloop", "status-reporter"},
            CERT_DIR,
        ),
    ],
)
def test_the_certificate_directory_is_reached_by_its_owners_alone(
    sets: list[str], owners: set[str], cert_dir: str
) -> None:
    """--cert-dir holds private keys (the serving certificate's; with a bootstrap token
    the node's client key): only its owners mount it, and no host path any other
    container of any workload mounts (eviction's root dir, read with DAC_READ_SEARCH,
    included) lies around it, as upstream's <root-dir>/pki would."""
    for component, w in workloads(render(sets=sets)).items():
        pod = w["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            args = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in c.get("args", []) if "=" in a}
            if component in SERVICES and c["name"] == component:
                assert args["--cert-dir"] == cert_dir
            for _, volume in mounts_of(w, c).values():
                if "hostPath" not in volume:
                    continue
                host = volume["hostPath"]["path"]
                mine = c["name"] in (component, "tls-bootstrap")
                if component in owners and mine and host == cert_dir:
                    continue
                assert not Path(cert_dir).is_relative_to(host), (component, c["name"], host)


def test_bootstrap_cert_dir_and_secret_key_from_the_values(tmp_path: Path) -> None:
    """Another certificate directory and key; the rendered flags load as pod-source
    would load them (the files stood in for), rotation on."""
    sets = [
        "credentials.bootstrap.existingSecret=join",
        "credentials.bootstrap.key=token.conf",
        "credentials.bootstrap.certDir=/srv/klet/pki/",
        "kubeletConfig.rotateCertificates=true",
    ]
    docs = render(sets=sets)
    w = workloads(docs)["pod-source"]
    (args,) = [
        i["args"]
        for i in w["spec"]["template"]["spec"]["initContainers"]
        if i["name"] == "tls-bootstrap"
    ]
    assert "--kubeconfig=/srv/klet/pki/kubelet.conf" in args
    assert "--kubeconfig=/srv/klet/pki/kubelet.conf" in container(w)["args"]
    assert "--bootstrap-kubeconfig=/etc/klet/bootstrap/token.conf" in args
    assert "--cert-dir=/srv/klet/pki" in args
    assert host_paths(w)["/srv/klet/pki"] == ("/srv/klet/pki", True)
    config = tmp_path / "kubelet-config.yaml"
    config.write_text(yaml.safe_dump(kubelet_config(docs)))
    argv = [
        a.replace("/etc/klet/config/kubelet-config.yaml", str(config))
        .replace("$(NODE_NAME)", "node-b")
        .replace("$(NODE_IP)", "10.0.0.9")
        for a in args
    ]
    settings = load_settings(argv, env={}, service="pod-source")
    assert settings.klet.kubeconfig == Path("/srv/klet/pki/kubelet.conf")
    assert settings.klet.bootstrap_kubeconfig == Path("/etc/klet/bootstrap/token.conf")
    assert settings.klet.cert_dir == Path("/srv/klet/pki")
    assert settings.kubelet.rotate_certificates is True


@pytest.mark.parametrize(
    ("sets", "why"),
    [
        (
            ["credentials.existingSecret=node", "credentials.bootstrap.existingSecret=join"],
            "credentials.existingSecret and credentials.bootstrap.existingSecret are both set",
        ),
        (
            ["kubeletConfig.rotateCertificates=true"],
            "kubeletConfig.rotateCertificates: needs credentials.bootstrap.existingSecret",
        ),
        (
            ["credentials.existingSecret=node", "kubeletConfig.rotateCertificates=true"],
            "a kubeconfig from credentials.existingSecret is a read-only Secret",
        ),
        (
            ["kubeletConfig.serverTLSBootstrap=true"],
            "kubeletConfig.serverTLSBootstrap: needs credentials",
        ),
        (
            # Upstream's default: inside the root dir, which eviction reads.
            [
                "credentials.bootstrap.existingSecret=j",
                "credentials.bootstrap.certDir=/var/lib/kubelet/pki",
            ],
            "certDir /var/lib/kubelet/pki: give it a directory of its own, neither inside nor "
            "around paths.rootDir (/var/lib/kubelet)",
        ),
        (
            # Without a bootstrap token too: status-reporter's serving key.
            ["paths.certDir=/var/lib/kubelet/pki"],
            "paths.certDir /var/lib/kubelet/pki: give it a directory of its own, neither "
            "inside nor around paths.rootDir (/var/lib/kubelet)",
        ),
        (
            ["credentials.bootstrap.existingSecret=j", "credentials.bootstrap.certDir=/run"],
            "around paths.redisSocketDir (/run/klet/redis)",
        ),
        (
            [
                "credentials.bootstrap.existingSecret=j",
                "credentials.bootstrap.certDir=/run/klet/pki",
            ],
            "inside nor around paths.runDir (/run/klet)",
        ),
    ],
)
def test_contradictory_credentials_are_refused(sets: list[str], why: str) -> None:
    assert why in render_error(sets=sets)


# ---------------------------------------------------------------------------------------
# Redis


def test_external_redis_with_per_node_per_service_users() -> None:
    """externalRedis.perNodeUsers: no set-up workload at all (an operator provisioned the
    users); each service is klet-<service>@<node> with its own password alone, from the
    directory the operator copies it to, as with the bundled Redis, and no supplemental
    group (no Redis socket of ours)."""
    docs = render([CI["external-redis-values"]])
    found = workloads(docs)
    assert set(found) == set(SERVICES) - {"image-gc"}  # no redis, no bus-users
    for service in set(SERVICES) - {"image-gc"}:
        w = found[service]
        env = env_of(container(w))
        assert env["KLET_REDIS_URL"] == "rediss://redis.example:6380"
        assert env["KLET_REDIS_USERNAME"] == f"klet-{service}@$(NODE_NAME)"
        assert env["KLET_REDIS_PASSWORD_FILE"] == "/etc/klet/bus/password"
        volume = mounts_of(w)["/etc/klet/bus"][1]
        assert volume["hostPath"]["path"] == f"/var/lib/klet/bus/services/{service}"
        spec = w["spec"]["template"]["spec"]
        assert not [v for v in spec["volumes"] if "secret" in v], service
        assert "securityContext" not in spec, service
        (wait,) = spec["initContainers"]
        assert wait["name"] == "wait-bus"


NODE_SECRETS = {
    "node-a-kubeconfig",
    "klet-bootstrap",
    "klet-node-1-kubeconfig",
    "klet-node-2-kubeconfig",
}
"""The only Secrets a rendered pod may mount: the node's own credentials (these tests'
and the ci/*.yaml values')."""


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["credentials.existingSecret=node-a-kubeconfig"],
        ["credentials.bootstrap.existingSecret=klet-bootstrap"],
        [
            "redis.enabled=false",
            "externalRedis.url=rediss://r:6380",
            "externalRedis.perNodeUsers=true",
        ],
        [
            "redis.enabled=false",
            "externalRedis.url=unix:///run/r.sock",
            "externalRedis.perNodeUsers=true",
        ],
    ],
)
def test_no_pod_template_mounts_a_secret_but_the_nodes_credentials(sets: list[str]) -> None:
    """Whatever the values (and every ci/*.yaml below), no pod template of a DaemonSet,
    Deployment, Job or Pod has a Secret volume (or a projected Secret, or an env from a
    Secret) other than the node's own credentials: an external Redis's admin password is
    never on a node."""
    renderings = [render(sets=sets)] + [render([path]) for path in CI_VALUES]
    for docs in renderings:
        for d in docs:
            if d["kind"] in WORKLOAD_KINDS | {"Job", "CronJob", "StatefulSet", "ReplicaSet"}:
                pod = d["spec"]["template"]["spec"]
            elif d["kind"] == "Pod":
                pod = d["spec"]
            else:
                continue
            text = json.dumps(pod)
            for volume in pod.get("volumes", []):
                secret = (volume.get("secret") or {}).get("secretName")
                assert secret is None or secret in NODE_SECRETS, (d, secret)
                assert "projected" not in volume or "secret" not in json.dumps(volume), d
            assert "secretKeyRef" not in text and "secretRef" not in text, d["metadata"]["name"]
            assert "redis-admin" not in text, d["metadata"]["name"]


@pytest.mark.parametrize(
    "sets",
    [
        ["externalRedis.admin.passwordSecret.name=klet-redis-admin"],
        ["externalRedis.admin.username=root", "externalRedis.perNodeUsers=true"],
    ],
)
def test_an_admin_password_for_the_cluster_is_refused_naming_what_to_do(sets: list[str]) -> None:
    err = render_error(sets=["redis.enabled=false", "externalRedis.url=rediss://r:6380", *sets])
    assert "externalRedis.admin: not supported" in err
    assert "klet bus-acl --apply" in err and "externalRedis.perNodeUsers: true" in err


def test_external_redis_shared_user_is_refused_for_a_daemonset() -> None:
    shared = [
        "redis.enabled=false",
        "externalRedis.url=rediss://r:6380",
        "externalRedis.username=klet",
        "externalRedis.passwordSecret.name=s",
    ]
    err = render_error(sets=shared)
    assert "externalRedis: services.pod-source is a DaemonSet" in err
    assert "klet bus-acl --apply" in err and "externalRedis.perNodeUsers" in err
    err = render_error(sets=["redis.enabled=false", "externalRedis.url=unix:///run/r.sock"])
    assert "is a DaemonSet, and one Redis user for every service" in err
    err = render_error(sets=[*shared, "externalRedis.perNodeUsers=true"])
    assert "externalRedis: give perNodeUsers" in err and "not both" in err
    # One node (every service a pinned Deployment): one user may serve it.
    pinned = ["serviceDefaults.kind=Deployment", PINNED]
    docs = render(sets=[*shared, *pinned])
    found = workloads(docs)
    assert "bus-users" not in found
    env = env_of(container(found["syncloop"]))
    assert env["KLET_REDIS_USERNAME"] == "klet"
    assert env["KLET_REDIS_PASSWORD_FILE"] == "/etc/klet/redis/password"
    assert mounts_of(found["syncloop"])["/etc/klet/redis"][1]["secret"]["secretName"] == "s"
    assert not [p for p in mounts_of(found["syncloop"]) if p.startswith("/etc/klet/bus")]


def test_external_redis_on_a_unix_socket_of_the_host() -> None:
    docs = render(
        sets=[
            "redis.enabled=false",
            "externalRedis.url=unix:///run/bus/redis.sock",
            "externalRedis.perNodeUsers=true",
        ]
    )
    for component in ("syncloop",):
        w = workloads(docs)[component]
        c = container(w)
        mount, volume = mounts_of(w, c)["/run/bus"]
        assert mount["readOnly"] is True
        assert volume["hostPath"] == {"path": "/run/bus", "type": "DirectoryOrCreate"}
        assert "/run/klet/redis" not in mounts_of(w, c)
    env = env_of(container(workloads(docs)["syncloop"]))
    assert env["KLET_REDIS_URL"] == "unix:///run/bus/redis.sock"


def test_bundled_redis_is_on_a_unix_socket_with_per_service_users() -> None:
    """Each service reads its own password from the directory the Redis pod's init
    container copies it to (a DaemonSet cannot name the node in a hostPath), after an
    init container of its own has waited for it; it reaches the socket through Redis's
    group."""
    found = workloads(render())
    for service in SERVICES:
        w = found[service]
        pod = w["spec"]["template"]["spec"]
        env = env_of(container(w))
        assert env["KLET_REDIS_URL"] == "unix:///run/klet/redis/redis.sock"
        assert env["KLET_REDIS_USERNAME"] == f"klet-{service}@$(NODE_NAME)"
        assert env["KLET_REDIS_PASSWORD_FILE"] == "/etc/klet/bus/password"
        names = [e["name"] for e in container(w)["env"]]
        assert names.index("NODE_NAME") < names.index("KLET_REDIS_USERNAME")  # expands
        mount, volume = mounts_of(w)["/etc/klet/bus"]
        assert mount["readOnly"] is True
        assert volume["hostPath"]["path"] == f"/var/lib/klet/bus/services/{service}"
        assert not [p for p in mounts_of(w) if p.startswith("/var/lib/klet/bus")]
        assert pod["securityContext"] == {"supplementalGroups": [6379]}
        (wait,) = pod["initContainers"]
        assert "until [ -s /etc/klet/bus/password ]" in wait["command"][2]
        assert set(mounts_of(w, wait)) == {"/etc/klet/bus"}
        assert wait["securityContext"]["capabilities"] == {"drop": ["ALL"]}


# ---------------------------------------------------------------------------------------
# metrics and helm test


def test_service_monitor_only_when_enabled() -> None:
    for name in ("default-values", "pinned-values", "external-redis-values"):
        assert not of_kind(render([CI[name]]), "ServiceMonitor"), name
    docs = render([CI["secret-values"]])
    (monitor,) = of_kind(docs, "ServiceMonitor")
    (service,) = of_kind(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # kube-prometheus's kubelet endpoints: the three paths, labels honoured, cAdvisor's
    # own timestamps not, `metrics_path` and `job="kubelet"` as kubernetes-mixin selects
    endpoints = monitor["spec"]["endpoints"]
    assert [(e["port"], e["scheme"], e["path"]) for e in endpoints] == [
        ("https-metrics", "https", "/metrics"),
        ("https-metrics", "https", "/metrics/cadvisor"),
        ("https-metrics", "https", "/metrics/probes"),
    ]
    for e in endpoints:
        assert e["honorLabels"] is True
        assert e["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
        assert {"sourceLabels": ["__metrics_path__"], "targetLabel": "metrics_path"}.items() <= (
            e["relabelings"][0].items()
        )
        assert e["relabelings"][1] == {
            "action": "replace",
            "targetLabel": "job",
            "replacement": "kubelet",
        }
    endpoint, cadvisor, probes = endpoints
    assert cadvisor["honorTimestamps"] is False and "honorTimestamps" not in endpoint
    drops = cadvisor["metricRelabelings"]
    assert [d["action"] for d in drops] == ["drop"] * 3
    assert drops[1]["sourceLabels"] == ["__name__", "pod", "namespace"]
    assert "metricRelabelings" not in endpoint and "metricRelabelings" not in probes
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
    for e in monitor["spec"]["endpoints"]:
        assert e["tlsConfig"]["insecureSkipVerify"] is True


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


def test_a_tcp_redis_needs_a_password_or_per_node_users() -> None:
    pinned = ["serviceDefaults.kind=Deployment", PINNED]
    tcp = ["redis.enabled=false", "externalRedis.url=redis://r:6379"]
    render(sets=[*tcp, "externalRedis.passwordSecret.name=s", *pinned])
    render(sets=[*tcp, "externalRedis.perNodeUsers=true"])
    err = render_error(sets=[*tcp, *pinned])
    assert "values don't meet the specifications of the schema" in err


def test_status_reporter_has_a_memory_limit() -> None:
    """It faces the network: a flood must end in its own OOM kill, not the node's."""
    found = workloads(render())
    limits = container(found["status-reporter"])["resources"]["limits"]
    assert limits["memory"] == "256Mi"
    assert container(found["status-reporter"])["resources"]["requests"]["memory"] == "128Mi"
    assert "limits" not in container(found["syncloop"])["resources"]


@pytest.mark.parametrize("service", SERVICES)
def test_the_runtime_socket_is_syncloops_and_each_readers_cri_proxy_its_own(
    service: str,
) -> None:
    """Only syncloop's container mounts the runtime's socket directory. Each reader's
    pod has a `cri-proxy` container (klet cri-proxy for that service alone), confined as
    the services are (no capability, no privilege escalation, read-only root, the
    runtime's seccomp profile), which mounts the runtime's socket directory read-only
    and a memory emptyDir where it serves the socket; the reader mounts that emptyDir
    read-only and takes the socket as its runtime and image endpoint. No other pod has
    the emptyDir, so no service reaches another's socket."""
    w = workloads(render())[service]
    pod = w["spec"]["template"]["spec"]
    main = container(w)
    runtime_dir = "/run/containerd"
    main_mounts = {m["mountPath"] for m in main["volumeMounts"]}
    assert (runtime_dir in main_mounts) is (service == "syncloop")
    args = dict(a.split("=", 1) for a in main["args"] if "=" in a)
    if service not in READERS:
        assert len(pod["containers"]) == 1
        assert args["--container-runtime-endpoint"] == "unix:///run/containerd/containerd.sock"
        assert "--image-service-endpoint" not in args
        return
    assert args["--container-runtime-endpoint"] == "unix:///run/klet-cri/cri.sock"
    assert args["--image-service-endpoint"] == "unix:///run/klet-cri/cri.sock"
    (proxy,) = [c for c in pod["containers"] if c["name"] == "cri-proxy"]
    assert proxy["command"] == ["klet", "cri-proxy"]
    assert proxy["args"] == [
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
        f"--service={service}",
        f"--socket={service}=/run/klet-cri/cri.sock",
    ]
    assert proxy["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert proxy["resources"]["limits"]["memory"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["mountPath"]: m.get("readOnly", False) for m in proxy["volumeMounts"]} == {
        "/run/klet-cri": False,
        runtime_dir: True,
    }
    (shared,) = [m for m in main["volumeMounts"] if m["mountPath"] == "/run/klet-cri"]
    assert shared["readOnly"] is True
    assert volumes[shared["name"]]["emptyDir"]["medium"] == "Memory"
    (sock_dir,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == runtime_dir]
    assert volumes[sock_dir["name"]]["hostPath"]["path"] == runtime_dir


def test_pod_source_mounts_the_static_pod_directory_alone() -> None:
    """pod-source mounts kubeletConfig.staticPodPath and nothing else of the host's
    /etc/kubernetes (a control-plane node keeps admin.conf and the CA keys beside the
    manifests); with no staticPodPath it mounts none; no other service mounts it; and
    paths.kubernetesDir, which named the whole directory, is refused by the schema."""
    for path in (STATIC_POD_PATH, "/srv/klet/pods"):
        ws = workloads(render(sets=[f"kubeletConfig.staticPodPath={path}"]))
        hosts = {
            s: {v["hostPath"]["path"] for _, v in mounts_of(w).values() if "hostPath" in v}
            for s, w in ws.items()
            if s in SERVICES
        }
        assert path in hosts["pod-source"]
        assert not any(h == "/etc/kubernetes" for h in hosts["pod-source"])
        for service in SERVICES:
            assert (path in hosts[service]) is (service == "pod-source"), service
    ws = workloads(render(sets=["kubeletConfig.staticPodPath="]))
    volumes = ws["pod-source"]["spec"]["template"]["spec"]["volumes"]
    assert "static-pod-path" not in {v["name"] for v in volumes}
    assert not [p for p in mounts_of(ws["pod-source"]) if p.startswith("/etc/kubernetes")]
    assert "kubernetesDir" in render_error(sets=["paths.kubernetesDir=/etc/kubernetes"])

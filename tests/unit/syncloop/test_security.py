"""securityContext → CRI security settings (syncloop/security.py), as upstream maps them.

Table-driven: container fields over pod fields, the image's user and runAsNonRoot
(upstream's messages), capability names passed through, no_new_privs only for an
explicit allowPrivilegeEscalation: false (and the API's privileged / CAP_SYS_ADMIN
conflict refused), fsGroup first among the supplemental groups, sysctl name
normalisation, namespace modes (hostNetwork/hostPID/hostIPC, shareProcessNamespace),
seccomp and AppArmor profiles, the sandbox's context (privileged when any container
is); then the same through criconfig, the CRI message conversion, and PodSyncer
refusing a root image under runAsNonRoot with CreateContainerConfigError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb
from klet.cri.client import _container_pb, _image, _sandbox_pb
from klet.cri.types import (
    ImageInfo,
    NamespaceMode,
    NamespaceOptions,
    ProfileType,
    SecurityProfile,
    SELinuxOptions,
)
from klet.model.types import ImageRef
from klet.syncloop.containers import criconfig, security
from klet.syncloop.containers.security import ImageUser, SecurityConfigError, SecuritySettings
from klet.syncloop.pods.syncpod import PodSyncer
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import RecordedEvents, wire

IMAGE = "registry.klet.test/busybox:1.36"
ROOT = ImageUser(uid=0)
REF = '(pod: "web-node1_default(u1)", container: app)'


def make_pod(
    pod_sc: dict[str, Any] | None = None,
    container_sc: dict[str, Any] | None = None,
    *,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": IMAGE}
    if container_sc is not None:
        container["securityContext"] = container_sc
    p: dict[str, Any] = {
        "metadata": {"name": "web-node1", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [container], **spec},
    }
    if pod_sc is not None:
        p["spec"]["securityContext"] = pod_sc
    if annotations:
        p["metadata"]["annotations"] = annotations
    return p


def csec(p: dict[str, Any], image: ImageUser | None = ROOT, **kw: Any) -> Any:
    return security.container_security(p, p["spec"]["containers"][0], image=image, **kw)


# -- user, group, precedence ----------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "image", "user", "username", "group"),
    [
        (None, None, ROOT, 0, "", None),  # the image's root is passed on explicitly
        (None, None, ImageUser(uid=1001), 1001, "", None),
        (None, None, ImageUser(uid=None, username="www"), None, "www", None),
        (None, None, None, None, "", None),  # unknown image user: left to the runtime
        ({"runAsUser": 1000, "runAsGroup": 3000}, None, ROOT, 1000, "", 3000),
        ({"runAsUser": 1000, "runAsGroup": 3000}, {"runAsUser": 2000}, ROOT, 2000, "", 3000),
        ({"runAsUser": 1000}, {"runAsGroup": 5}, ROOT, 1000, "", 5),
        (None, {"runAsUser": 0}, ImageUser(uid=7), 0, "", None),
    ],
)
def test_run_as_user_and_group_container_over_pod_over_image(
    pod_sc: Any, container_sc: Any, image: ImageUser | None, user: Any, username: str, group: Any
) -> None:
    sec = csec(make_pod(pod_sc, container_sc), image)
    assert (sec.run_as_user, sec.run_as_username, sec.run_as_group) == (user, username, group)


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "expected"),
    [
        ({"seLinuxOptions": {"level": "s0:c1"}}, None, SELinuxOptions(level="s0:c1")),
        (
            {"seLinuxOptions": {"level": "s0:c1", "user": "u"}},
            {"seLinuxOptions": {"type": "t"}},
            SELinuxOptions(type="t"),  # the container's object replaces the pod's whole
        ),
        (None, None, None),
    ],
)
def test_selinux_options_pass_through(pod_sc: Any, container_sc: Any, expected: Any) -> None:
    assert csec(make_pod(pod_sc, container_sc)).selinux == expected


# -- runAsNonRoot -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "image", "error"),
    [
        (None, None, ROOT, None),
        (
            {"runAsNonRoot": True},
            None,
            ROOT,
            f"container has runAsNonRoot and image will run as root {REF}",
        ),
        (None, {"runAsNonRoot": True}, None, None),  # nothing known to check against
        ({"runAsNonRoot": True}, {"runAsNonRoot": False}, ROOT, None),
        ({"runAsNonRoot": True}, None, ImageUser(uid=1000), None),
        ({"runAsNonRoot": True, "runAsUser": 1000}, None, ROOT, None),
        (
            {"runAsNonRoot": True},
            {"runAsUser": 0},
            ImageUser(uid=1000),
            f"container's runAsUser breaks non-root policy {REF}",
        ),
        (
            {"runAsNonRoot": True},
            None,
            ImageUser(uid=None, username="www"),
            "container has runAsNonRoot and image has non-numeric user (www), "
            f"cannot verify user is non-root {REF}",
        ),
        (
            {"runAsNonRoot": True},
            None,
            ImageUser(uid=2**31),
            "container has runAsNonRoot and image has an invalid user id (2147483648). "
            "(Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive " + REF,
        ),
    ],
)
def test_run_as_non_root(pod_sc: Any, container_sc: Any, image: Any, error: str | None) -> None:
    p = make_pod(pod_sc, container_sc)
    if error is None:
        csec(p, image)
    else:
        with pytest.raises(SecurityConfigError) as exc:
            csec(p, image)
        assert str(exc.value) == error


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (None, ImageUser(uid=0)),  # no status: treated as root
        (ImageInfo(ImageRef("sha256:a"), (), (), 1), ImageUser(uid=0)),  # no user: root
        (ImageInfo(ImageRef("sha256:a"), (), (), 1, uid=1000), ImageUser(uid=1000)),
        (ImageInfo(ImageRef("sha256:a"), (), (), 1, username="www"), ImageUser(None, "www")),
    ],
)
def test_image_user_from_image_status(info: ImageInfo | None, expected: ImageUser) -> None:
    assert security.image_user(info) == expected


# -- privileges -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container_sc", "add", "drop"),
    [
        ({"capabilities": {"add": ["NET_ADMIN"], "drop": ["CHOWN"]}}, ("NET_ADMIN",), ("CHOWN",)),
        ({"capabilities": {"add": ["CAP_SYS_TIME", "all"]}}, ("CAP_SYS_TIME", "all"), ()),
        ({"capabilities": {"drop": ["ALL"]}}, (), ("ALL",)),
        (None, (), ()),
    ],
)
def test_capability_names_pass_through_as_written(container_sc: Any, add: Any, drop: Any) -> None:
    sec = csec(make_pod(None, container_sc))
    assert (sec.add_capabilities, sec.drop_capabilities) == (add, drop)


@pytest.mark.parametrize(
    ("container_sc", "no_new_privs"),
    [
        (None, False),
        ({"allowPrivilegeEscalation": True}, False),
        ({"allowPrivilegeEscalation": False}, True),
        ({"allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_ADMIN"]}}, True),
        ({"privileged": True}, False),
    ],
)
def test_no_new_privs_only_when_escalation_is_explicitly_disallowed(
    container_sc: Any, no_new_privs: bool
) -> None:
    assert csec(make_pod(None, container_sc)).no_new_privs is no_new_privs


@pytest.mark.parametrize(
    ("container_sc", "message"),
    [
        (
            {"allowPrivilegeEscalation": False, "privileged": True},
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
        ),
        (
            {"allowPrivilegeEscalation": False, "capabilities": {"add": ["CAP_SYS_ADMIN"]}},
            "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN",
        ),
    ],
)
def test_escalation_conflicts_are_refused(container_sc: Any, message: str) -> None:
    with pytest.raises(SecurityConfigError, match="invalid securityContext of container app"):
        csec(make_pod(None, container_sc))
    assert security.privilege_escalation_errors(
        make_pod(None, container_sc)["spec"]["containers"][0]
    ) == [message]


@pytest.mark.parametrize(
    ("container_sc", "privileged", "readonly", "masked"),
    [
        (None, False, False, True),
        ({"privileged": True, "readOnlyRootFilesystem": True}, True, True, True),
        ({"procMount": "Unmasked"}, False, False, False),
        ({"procMount": "Default"}, False, False, True),
    ],
)
def test_privileged_readonly_rootfs_and_proc_mount(
    container_sc: Any, privileged: bool, readonly: bool, masked: bool
) -> None:
    sec = csec(make_pod(None, container_sc))
    assert (sec.privileged, sec.readonly_rootfs) == (privileged, readonly)
    assert sec.masked_paths == (security.DEFAULT_MASKED_PATHS if masked else ())
    assert sec.readonly_paths == (security.DEFAULT_READONLY_PATHS if masked else ())


# -- groups -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_sc", "groups", "policy"),
    [
        (None, (), "Merge"),
        ({"fsGroup": 2000}, (2000,), "Merge"),
        ({"fsGroup": 2000, "supplementalGroups": [4000, 5000]}, (2000, 4000, 5000), "Merge"),
        ({"supplementalGroups": [4000], "supplementalGroupsPolicy": "Strict"}, (4000,), "Strict"),
    ],
)
def test_fs_group_comes_first_among_supplemental_groups(
    pod_sc: Any, groups: tuple[int, ...], policy: str
) -> None:
    p = make_pod(pod_sc, {"runAsUser": 1})
    sec = csec(p)
    assert (sec.supplemental_groups, sec.supplemental_groups_policy) == (groups, policy)
    sandbox = security.sandbox_security(p)
    assert (sandbox.supplemental_groups, sandbox.supplemental_groups_policy) == (groups, policy)


def test_unknown_supplemental_groups_policy_is_a_config_error() -> None:
    p = make_pod({"supplementalGroupsPolicy": "Loose"})
    with pytest.raises(SecurityConfigError, match="unsupported supplementalGroupsPolicy: Loose"):
        csec(p)
    assert security.sandbox_security(p).supplemental_groups_policy == "Merge"


# -- pod level: namespaces, sysctls, the sandbox -------------------------------------------


P, C, N = NamespaceMode.POD, NamespaceMode.CONTAINER, NamespaceMode.NODE


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, NamespaceOptions(network=P, pid=C, ipc=P)),
        ({"hostNetwork": True}, NamespaceOptions(network=N, pid=C, ipc=P)),
        ({"hostPID": True}, NamespaceOptions(network=P, pid=N, ipc=P)),
        ({"hostIPC": True}, NamespaceOptions(network=P, pid=C, ipc=N)),
        ({"shareProcessNamespace": True}, NamespaceOptions(network=P, pid=P, ipc=P)),
        ({"shareProcessNamespace": True, "hostPID": True}, NamespaceOptions(pid=N)),
    ],
)
def test_namespace_modes(spec: dict[str, Any], expected: NamespaceOptions) -> None:
    p = make_pod(**spec)
    assert security.namespaces(p) == expected
    assert csec(p).namespaces == expected
    assert security.sandbox_security(p).namespaces == expected


@pytest.mark.parametrize(
    ("name", "normalized"),
    [
        ("kernel.shm_rmid_forced", "kernel.shm_rmid_forced"),
        ("kernel/shm_rmid_forced", "kernel.shm_rmid_forced"),
        ("net.ipv4.conf.eno2/100.rp_filter", "net.ipv4.conf.eno2/100.rp_filter"),
        ("net/ipv4/conf/eno2.100/rp_filter", "net.ipv4.conf.eno2/100.rp_filter"),
        ("plain", "plain"),
    ],
)
def test_sysctl_names_use_dots(name: str, normalized: str) -> None:
    p = make_pod({"sysctls": [{"name": name, "value": "1"}]})
    assert security.sysctls(p) == {normalized: "1"}


@pytest.mark.parametrize(
    ("spec", "privileged"),
    [
        ({}, False),
        ({"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]}, True),
        ({"ephemeralContainers": [{"name": "e", "securityContext": {"privileged": True}}]}, True),
    ],
)
def test_sandbox_is_privileged_when_any_container_is(
    spec: dict[str, Any], privileged: bool
) -> None:
    assert security.sandbox_security(make_pod(**spec)).privileged is privileged
    assert security.sandbox_security(make_pod(None, {"privileged": True})).privileged


def test_sandbox_takes_the_pod_user_and_runtime_default_seccomp() -> None:
    p = make_pod({"runAsUser": 1000, "runAsGroup": 3000, "seLinuxOptions": {"role": "r"}})
    sandbox = security.sandbox_security(p)
    assert (sandbox.run_as_user, sandbox.run_as_group) == (1000, 3000)
    assert sandbox.seccomp == SecurityProfile(ProfileType.RUNTIME_DEFAULT)
    assert sandbox.selinux == SELinuxOptions(role="r")
    bare = security.sandbox_security(make_pod())
    assert (bare.run_as_user, bare.run_as_group, bare.selinux) == (None, None, None)


# -- seccomp and AppArmor ----------------------------------------------------------------

RD = SecurityProfile(ProfileType.RUNTIME_DEFAULT)
UNC = SecurityProfile(ProfileType.UNCONFINED)


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "settings", "expected"),
    [
        (None, None, SecuritySettings(), UNC),
        (None, None, SecuritySettings(seccomp_default=True), RD),
        ({"seccompProfile": {"type": "RuntimeDefault"}}, None, SecuritySettings(), RD),
        (
            {"seccompProfile": {"type": "RuntimeDefault"}},
            {"seccompProfile": {"type": "Unconfined"}},
            SecuritySettings(),
            UNC,
        ),
        (
            None,
            {"seccompProfile": {"type": "Localhost", "localhostProfile": "audit.json"}},
            SecuritySettings(seccomp_profile_root="/var/lib/kubelet/seccomp"),
            SecurityProfile(ProfileType.LOCALHOST, "/var/lib/kubelet/seccomp/audit.json"),
        ),
    ],
)
def test_seccomp_profile(pod_sc: Any, container_sc: Any, settings: Any, expected: Any) -> None:
    assert csec(make_pod(pod_sc, container_sc), settings=settings).seccomp == expected


def test_localhost_seccomp_needs_a_profile_name() -> None:
    with pytest.raises(SecurityConfigError, match="localhostProfile must be set"):
        csec(make_pod(None, {"seccompProfile": {"type": "Localhost"}}))


ANN = security.APPARMOR_ANNOTATION_PREFIX + "app"


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "annotations", "profile", "name"),
    [
        (None, None, None, None, ""),
        ({"appArmorProfile": {"type": "RuntimeDefault"}}, None, None, RD, "runtime/default"),
        (
            {"appArmorProfile": {"type": "RuntimeDefault"}},
            {"appArmorProfile": {"type": "Unconfined"}},
            None,
            UNC,
            "unconfined",
        ),
        (
            {"appArmorProfile": {"type": "RuntimeDefault"}},
            None,
            {ANN: "localhost/k8s-deny"},  # the annotation comes before the pod field
            SecurityProfile(ProfileType.LOCALHOST, "k8s-deny"),
            "localhost/k8s-deny",
        ),
        (None, None, {ANN: "bogus"}, None, ""),
    ],
)
def test_apparmor_profile(
    pod_sc: Any, container_sc: Any, annotations: Any, profile: Any, name: str
) -> None:
    sec = csec(make_pod(pod_sc, container_sc, annotations=annotations))
    assert (sec.apparmor, sec.apparmor_profile) == (profile, name)


def test_localhost_apparmor_needs_a_profile_name() -> None:
    with pytest.raises(SecurityConfigError, match="missing localhost apparmor profile name"):
        csec(make_pod(None, {"appArmorProfile": {"type": "Localhost"}}))


# -- criconfig and the CRI messages ---------------------------------------------------------


def test_criconfig_and_cri_messages_carry_the_security_context() -> None:
    p = make_pod(
        {
            "fsGroup": 2000,
            "runAsUser": 1000,
            "sysctls": [{"name": "kernel/shm_rmid_forced", "value": "1"}],
        },
        {
            "capabilities": {"add": ["NET_ADMIN"]},
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        hostIPC=True,
        shareProcessNamespace=True,
    )
    sandbox = criconfig.sandbox_config(p, attempt=0, pod_logs_dir="/logs", cgroup_parent="")
    assert sandbox.sysctls == {"kernel.shm_rmid_forced": "1"}
    spb = _sandbox_pb(sandbox).linux
    assert dict(spb.sysctls) == {"kernel.shm_rmid_forced": "1"}
    ssc = spb.security_context
    assert ssc.namespace_options.ipc == pb.NamespaceMode.NODE
    assert ssc.namespace_options.pid == pb.NamespaceMode.POD
    assert ssc.run_as_user.value == 1000 and not ssc.HasField("run_as_group")
    assert list(ssc.supplemental_groups) == [2000]
    assert ssc.seccomp.profile_type == pb.SecurityProfile.RuntimeDefault and ssc.HasField("seccomp")

    cfg = criconfig.container_config(
        p,
        p["spec"]["containers"][0],
        instance=criconfig.Instance(restart_count=0, image="sha256:img", image_user=ROOT),
        node=criconfig.NodeContext(),
    )
    csc = _container_pb(cfg).linux.security_context
    assert csc.run_as_user.value == 1000 and not csc.HasField("run_as_group")
    assert list(csc.capabilities.add_capabilities) == ["NET_ADMIN"]
    assert csc.no_new_privs and csc.readonly_rootfs and not csc.privileged
    assert list(csc.supplemental_groups) == [2000]
    assert csc.namespace_options.pid == pb.NamespaceMode.POD
    assert csc.HasField("seccomp") and csc.seccomp.profile_type == pb.SecurityProfile.RuntimeDefault
    assert not csc.HasField("apparmor")
    assert list(csc.masked_paths) == list(security.DEFAULT_MASKED_PATHS)

    with pytest.raises(SecurityConfigError):
        criconfig.container_config(
            make_pod({"runAsNonRoot": True}),
            {"name": "app", "image": IMAGE},
            instance=criconfig.Instance(restart_count=0, image="sha256:img", image_user=ROOT),
            node=criconfig.NodeContext(),
        )


def test_a_container_without_security_leaves_the_message_unset() -> None:
    cfg = criconfig.container_config(
        make_pod(),
        {"name": "app", "image": IMAGE},
        instance=criconfig.Instance(restart_count=0, image="x"),
        node=criconfig.NodeContext(),
    )
    assert cfg.security is not None and cfg.security.run_as_user is None  # image user unknown
    from dataclasses import replace

    assert not _container_pb(replace(cfg, security=None)).linux.HasField("security_context")


def test_image_status_user_is_read_from_the_cri_message() -> None:
    numeric = pb.Image(id="sha256:a", size=1)
    numeric.uid.value = 1000
    assert (_image(numeric).uid, _image(numeric).username) == (1000, "")
    named = pb.Image(id="sha256:b", size=1, username="www")
    assert (_image(named).uid, _image(named).username) == (None, "www")


# -- PodSyncer ------------------------------------------------------------------------------


def syncer(cri: FakeRuntimeService, events: RecordedEvents, tmp_path: Path) -> PodSyncer:
    return wire(tmp_path, cri, events=events).controller.syncer


async def test_run_as_non_root_on_a_root_image_waits_with_create_container_config_error(
    tmp_path: Path,
) -> None:
    cri, events = FakeRuntimeService(), RecordedEvents()
    cri.add_image(IMAGE)  # no configured user: root
    p = make_pod({"runAsNonRoot": True})
    p["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    s = syncer(cri, events, tmp_path)
    result = await s.sync(p, await s.runtime.get("u1"))
    message = f"container has runAsNonRoot and image will run as root {REF}"
    assert result.waiting == {"app": ("CreateContainerConfigError", message)}
    assert cri.calls_of("CreateContainer") == []
    assert ("Warning", "Failed", f"Error: {message}") in events.triples()


async def test_the_image_user_and_security_reach_the_runtime(tmp_path: Path) -> None:
    cri, events = FakeRuntimeService(), RecordedEvents()
    cri.add_image(IMAGE, uid=1000)
    p = make_pod({"runAsNonRoot": True}, {"privileged": True})
    p["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    s = syncer(cri, events, tmp_path)
    result = await s.sync(p, await s.runtime.get("u1"))
    assert result.waiting == {}
    [container] = cri.containers.values()
    assert container.config.security is not None
    assert container.config.security.run_as_user == 1000 and container.config.security.privileged
    [sandbox] = cri.sandboxes.values()
    assert sandbox.config.security is not None and sandbox.config.security.privileged

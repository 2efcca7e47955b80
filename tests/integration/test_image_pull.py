"""Image pulls on the real containerd from a second, private registry that requires
basic authentication (htpasswd): without credentials a pod ends in ErrImagePull and
ImagePullBackOff in `/pods`, with the attempts spaced by a growing back-off; with the
node's docker config.json in the kubelet root dir it runs (a static pod may not name
pull secrets: test_static_pod_api_references.py); imagePullPolicy Never / IfNotPresent
/ Always as counted in the registry's access log; registryPullQPS refusing pulls with
"pull QPS exceeded"; the Pulling/Pulled/Failed/BackOff events on the bus."""

from __future__ import annotations

import base64
import json
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from klet.devstack import DevStack
from klet.devstack.images import ImageSpec, build, push
from klet.devstack.registry import Registry

from tests.harness.node import KletNode, bus_events, container_status
from tests.harness.waiting import wait_for

USER, PASSWORD = "alice", "wonderland"
REPOSITORY = "private/app"


class Private:
    """The authenticating registry, its image, and tags pushed for one test each."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.image = build(ImageSpec(name=f"{registry.address}/{REPOSITORY}", tag="1", cmd=["sh"]))

    def fresh_tag(self) -> str:
        """A tag containerd has never seen, pushed now: the image reference to use."""
        return self.push(self.unpushed_tag())

    def unpushed_tag(self) -> str:
        """The reference of a tag not pushed yet (a pull of it fails: no such manifest)."""
        return f"{self.registry.address}/{REPOSITORY}:{uuid.uuid4().hex[:10]}"

    def push(self, reference: str) -> str:
        push(
            self.image,
            self.registry.address,
            tag=reference.rpartition(":")[2],
            auth=(USER, PASSWORD),
        )
        return reference

    def served(self, reference: str) -> int:
        """Manifest requests for `reference` answered 200: the pulls that succeeded."""
        tag = reference.rpartition(":")[2]
        return self.registry.manifest_requests(REPOSITORY, tag=tag).get(200, 0)

    def refused(self, reference: str) -> int:
        tag = reference.rpartition(":")[2]
        return self.registry.manifest_requests(REPOSITORY, tag=tag).get(401, 0)


@contextmanager
def private_registry(devstack: DevStack, dir: Path) -> Iterator[Private]:
    """A started registry requiring USER/PASSWORD, known to the stack's containerd."""
    assert devstack.containerd is not None
    registry = Registry(dir, users={USER: PASSWORD})
    registry.start()
    hosts = registry.write_hosts_toml(devstack.containerd.certs_dir)
    try:
        yield Private(registry)
    finally:
        shutil.rmtree(hosts.parent, ignore_errors=True)
        registry.stop()


@pytest.fixture(scope="module")
def private(devstack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    with private_registry(devstack, tmp_path_factory.mktemp("private-registry")) as found:
        yield found


def write_node_credentials(node: KletNode, registry: Registry) -> None:
    """The node-wide docker config.json in the kubelet root dir (--root-dir)."""
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    node.root_dir.mkdir(parents=True, exist_ok=True)
    (node.root_dir / "config.json").write_text(
        json.dumps({"auths": {f"http://{registry.address}": {"auth": auth}}})
    )


def manifest(name: str, *images: tuple[str, str]) -> str:
    containers = "".join(
        f"""
    - name: c{i}
      image: {image}
      imagePullPolicy: {policy}
      command: ["sleep", "100000"]"""
        for i, (image, policy) in enumerate(images)
    )
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:{containers}
"""


def waiting(node: KletNode, name: str, container: str = "c0") -> dict[str, Any]:
    cs = container_status(node.pods()[f"{name}-{node.node_name}"], container)
    return cast(dict[str, Any], cs["state"].get("waiting") or {})


def running(node: KletNode, name: str) -> bool:
    pod = node.pods().get(f"{name}-{node.node_name}")
    return bool(
        pod
        and pod["status"].get("phase") == "Running"
        and bool(statuses := pod["status"].get("containerStatuses"))
        and all("running" in c["state"] for c in statuses)
    )


def test_without_credentials_the_pull_fails_and_backs_off(
    node_factory: Any, manifests: Path, private: Private
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    image = private.fresh_tag()
    (manifests / "noauth.yaml").write_text(manifest("noauth", (image, "IfNotPresent")))

    first = wait_for(
        lambda: (w := waiting(node, "noauth")).get("reason") == "ErrImagePull" and w,
        timeout_s=30,
        what="ErrImagePull in /pods",
    )
    assert "401 Unauthorized" in first["message"], first
    backoff = wait_for(
        lambda: (w := waiting(node, "noauth")).get("reason") == "ImagePullBackOff" and w,
        timeout_s=30,
        what="ImagePullBackOff in /pods",
    )
    assert backoff["message"].startswith(f'Back-off pulling image "{image}": ErrImagePull: ')

    # Three attempts: the second about 10 s after the first, the third about 20 s later.
    pulling = wait_for(
        lambda: (
            (p := [e.at for e in bus_events(node, "noauth") if e.reason == "Pulling"])[2:] and p
        ),
        timeout_s=60,
        what="three pull attempts",
    )
    gaps = [b - a for a, b in zip(pulling, pulling[1:], strict=False)]
    assert 9 <= gaps[0] < 18 and 19 <= gaps[1] < 30, gaps
    assert private.served(image) == 0 and private.refused(image) >= 3

    seen = bus_events(node, "noauth")
    reasons = {e.reason for e in seen}
    assert {"Pulling", "Failed", "BackOff"} <= reasons and "Pulled" not in reasons
    failed = [e for e in seen if e.reason == "Failed"]
    assert any(e.message.startswith(f'Failed to pull image "{image}": ') for e in failed)
    assert any(e.message == "Error: ErrImagePull" for e in failed)
    assert all(e.involved.get("fieldPath") == "spec.containers{c0}" for e in failed)


def test_node_credentials_in_the_root_dir_let_the_pod_run(
    node_factory: Any, manifests: Path, private: Private
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    write_node_credentials(node, private.registry)
    node.start()
    image = private.fresh_tag()
    (manifests / "withauth.yaml").write_text(manifest("withauth", (image, "IfNotPresent")))
    wait_for(lambda: running(node, "withauth"), timeout_s=40, what="withauth Running")
    assert private.served(image) == 1

    by_reason = {e.reason: e for e in bus_events(node, "withauth")}
    assert by_reason["Pulling"].message == f'Pulling image "{image}"'
    assert by_reason["Pulled"].message.startswith(f'Successfully pulled image "{image}" in ')
    assert "Image size: " in by_reason["Pulled"].message


def test_pull_policies_as_the_registry_sees_them(
    node_factory: Any, manifests: Path, private: Private
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    write_node_credentials(node, private.registry)
    node.start()
    never = private.fresh_tag()
    shared = private.fresh_tag()
    always = private.fresh_tag()

    (manifests / "never.yaml").write_text(manifest("never", (never, "Never")))
    w = wait_for(
        lambda: (w := waiting(node, "never")).get("reason") == "ErrImageNeverPull" and w,
        timeout_s=30,
        what="ErrImageNeverPull",
    )
    assert w["message"] == f'Container image "{never}" is not present with pull policy of Never'

    # IfNotPresent: the first pod pulls, the second finds the image on the node.
    (manifests / "first.yaml").write_text(manifest("first", (shared, "IfNotPresent")))
    wait_for(lambda: running(node, "first"), timeout_s=40, what="first Running")
    (manifests / "second.yaml").write_text(manifest("second", (shared, "IfNotPresent")))
    wait_for(lambda: running(node, "second"), timeout_s=40, what="second Running")
    assert private.served(shared) == 1
    assert any(
        e.reason == "Pulled"
        and e.message == f'Container image "{shared}" already present on machine'
        for e in bus_events(node, "second")
    )

    # Always: every pod pulls, although the image is there after the first.
    (manifests / "always1.yaml").write_text(manifest("always1", (always, "Always")))
    wait_for(lambda: running(node, "always1"), timeout_s=40, what="always1 Running")
    (manifests / "always2.yaml").write_text(manifest("always2", (always, "Always")))
    wait_for(lambda: running(node, "always2"), timeout_s=40, what="always2 Running")
    assert private.served(always) == 2

    # The Never pod was never pulled, even now that its tag could be.
    assert private.served(never) == 0 and private.refused(never) == 0
    assert waiting(node, "never").get("reason") == "ErrImageNeverPull"


def test_registry_qps_refuses_pulls_beyond_the_burst(
    node_factory: Any, manifests: Path, private: Private
) -> None:
    node: KletNode = node_factory(
        manifest_dir=manifests, extra_flags=["--registry-qps", "1", "--registry-burst", "1"]
    )
    write_node_credentials(node, private.registry)
    node.start()
    # The bucket holds a single token and gains one a second. c0's pull takes it and
    # fails at once (its tag is not pushed yet), so c1's pull follows in the same
    # sync with no container start in between (which a busy machine may stretch past
    # a second) and finds the bucket empty.
    images = [private.unpushed_tag(), private.fresh_tag()]
    (manifests / "qps.yaml").write_text(manifest("qps", *((i, "Always") for i in images)))

    def refused() -> list[int]:
        return [
            i
            for i in range(len(images))
            if waiting(node, "qps", f"c{i}").get("message") == "pull QPS exceeded"
        ]

    first_refused = wait_for(refused, timeout_s=30, what="a pull refused: 'pull QPS exceeded'")
    assert first_refused == [1]
    private.push(images[0])
    # A refused pull never reached the registry.
    assert all(private.served(images[i]) == 0 for i in first_refused)
    assert any(
        e.reason == "Failed" and e.message.endswith(": pull QPS exceeded")
        for e in bus_events(node, "qps")
    )
    # After their back-off the refused pulls are tried again, and all of them run. c0's
    # retry takes the token again, so c1 is refused once more and waits out a longer
    # back-off: about a minute in all.
    wait_for(lambda: running(node, "qps"), timeout_s=150, what="qps Running after the back-off")
    assert all(private.served(i) == 1 for i in images)

"""Static pods referencing API objects are refused, as upstream's
PreventStaticPodAPIReferences (on by default in v1.34), on real containerd: pod-source
refuses each manifest with upstream's message naming the field (logged with the file,
counted as an invalid manifest), no such pod reaches the node, and a plain static pod
beside them runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.node import KletNode
from tests.harness.pods import WEB, running
from tests.harness.waiting import wait_for


def referring(name: str, spec: str, container: str = "") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
{spec}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "1000"]
{container}"""


# file name -> (manifest, what pod-source reports)
REFUSED = {
    "cm-env.yaml": (
        referring(
            "cmenv",
            "  restartPolicy: Never",
            "      env:\n        - name: FROM_CM\n"
            "          valueFrom: {configMapKeyRef: {name: settings, key: level}}",
        ),
        "spec.containers[0].env[0].valueFrom.configMapKeyRef: "
        "static pods may not reference configmaps",
    ),
    "cm-vol.yaml": (
        referring("cmvol", "  volumes:\n    - name: cfg\n      configMap: {name: settings}"),
        "spec.volumes[0].configMap: static pods may not reference configmaps",
    ),
    "secret-vol.yaml": (
        referring("secretvol", "  volumes:\n    - name: s\n      secret: {secretName: creds}"),
        "spec.volumes[0].secret: static pods may not reference secrets",
    ),
    "pull-secret.yaml": (
        referring("pullsecret", "  imagePullSecrets: [{name: regcred}]"),
        "spec.imagePullSecrets[0]: static pods may not reference secrets",
    ),
    "claim.yaml": (
        referring(
            "claim", "  volumes:\n    - name: data\n      persistentVolumeClaim: {claimName: data}"
        ),
        "spec.volumes[0].persistentVolumeClaim: static pods may not reference "
        "persistentvolumeclaims",
    ),
    "sa.yaml": (
        referring("withsa", "  serviceAccountName: builder"),
        "spec.serviceAccountName: static pods may not reference serviceaccounts",
    ),
}


def test_static_pods_referencing_api_objects_are_refused(
    node_factory: Any, manifests: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    for file, (body, _) in REFUSED.items():
        (manifests / file).write_text(body)
    (manifests / "web.yaml").write_text(WEB)
    node.start()
    wait_for(lambda: running(node, "web"), timeout_s=30, what="the plain pod Running")

    def reported() -> list[str]:
        log = node.log("pod-source")
        return [f for f, (_, message) in REFUSED.items() if f in log and message in log]

    wait_for(lambda: len(reported()) == len(REFUSED), timeout_s=15, what="every refusal logged")
    log_lines = node.log("pod-source").splitlines()
    for file, (_, message) in REFUSED.items():
        assert any(file in line and message in line for line in log_lines), file
    assert set(node.pods()) == {f"web-{node.node_name}"}
    invalid = [
        line
        for line in node.metrics("pod-source").splitlines()
        if line.startswith("klet_pod_source_manifest_errors_total{") and 'reason="invalid"' in line
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in invalid) >= len(REFUSED)

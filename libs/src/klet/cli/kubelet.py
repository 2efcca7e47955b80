"""`kubelet`: klet as a drop-in for the upstream kubelet binary (issue 41).

It takes the v1.34.4 kubelet's command line, so the unit and drop-in the kubelet packages
install (`ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS
$KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS`, see packaging/) start klet unchanged, and runs
the node the way `klet up` does (klet.cli.up, `system=True`): the bundled Redis under
`/run/klet`, the five services supervised and restarted, the configured container
runtime (never a private one), upstream's directories (`/var/lib/kubelet`,
`/var/log/pods`), and systemd's notify protocol (klet.cli.sdnotify).

Each flag is decided by klet.cli.kubeletflags (implemented, accepted with upstream's
deprecation warning, or refused naming why) before anything starts. `--version` prints
`Kubernetes v1.34.4-klet`, the line kubeadm's preflight parses (`kubelet --version`), and
the same version the Node reports as its kubeletVersion.
"""

from __future__ import annotations

import sys

from klet.cli.kubeletflags import STATES, Handled, Ignored, Implemented, Refused, translate
from klet.config.gates import KUBERNETES_VERSION

__all__ = ["main", "usage"]


def usage() -> str:
    """The flags by state, for `kubelet --help`."""
    groups: dict[str, list[str]] = {"implemented": [], "handled": [], "ignored": [], "refused": []}
    for name, state in sorted(STATES.items()):
        if isinstance(state, Implemented):
            groups["implemented"].append(f"  --{name}")
        elif isinstance(state, Handled):
            groups["handled"].append(f"  --{name}: {state.what}")
        elif isinstance(state, Ignored):
            groups["ignored"].append(f"  --{name}: {state.reason}")
        elif isinstance(state, Refused):
            groups["refused"].append(f"  --{name}: {state.reason}")
    return "\n".join(
        [
            f"Usage: kubelet [flags]  (klet, a drop-in for the Kubernetes {KUBERNETES_VERSION} "
            "kubelet; `klet run <service> --help` describes each flag)",
            "",
            "Implemented (as klet's own flags of the same name):",
            *groups["implemented"],
            "",
            "Answered here:",
            *groups["handled"],
            "",
            "Accepted with upstream's deprecation warning, no effect here:",
            *groups["ignored"],
            "",
            "Refused (the start fails naming the flag):",
            *groups["refused"],
            "",
            "klet's own flags (--redis-url, --run-dir, ...) are accepted too.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = translate(args)
    if plan.problems:
        for problem in plan.problems:
            print(f"kubelet: {problem}", file=sys.stderr)
        return 1
    if plan.help:
        print(usage())
        return 0
    if plan.version:
        print(f"Kubernetes {KUBERNETES_VERSION}-klet")
        return 0
    for warning in plan.warnings:
        print(warning, file=sys.stderr)
    from klet.cli.up import up

    return up(plan.argv, system=True)


if __name__ == "__main__":
    sys.exit(main())

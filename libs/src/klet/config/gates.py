"""Feature gates: which names `featureGates` (and `--feature-gates`) may hold, and which
values klet acts on.

Upstream's kubelet refuses an entry naming a gate it does not know ("unrecognized feature
gate"), one that sets a locked gate away from its default, and one that sets a gate not
yet available at its version. klet knows the gates of the kubelet of the Kubernetes
version it reports (gatelist.py, generated from that release) and refuses the same.

It also refuses a gate set away from its upstream default unless klet acts on that gate
(`HONOURED`): turning on an upstream feature klet does not have, or off one it does not
make optional, would otherwise load and do nothing. That includes `AllAlpha: true` and
`AllBeta: true`, which turn on every gate of a stage. A gate set to its upstream default
is accepted (upstream accepts it too, with a log line for GA and deprecated gates); klet's
behaviour at that default is described with each feature (README), not here.

Trade-off: the gate list is a generated copy of one release's, so klet refuses a name a
later kubelet knows; that is the kubelet's own behaviour at that version.
"""

from __future__ import annotations

from collections.abc import Mapping

from klet.config.gatelist import GATES, KUBERNETES_VERSION

__all__ = ["GATES", "HONOURED", "KUBERNETES_VERSION", "gate_problems"]

# Gates klet reads, with what each changes. Any value of these loads.
HONOURED: Mapping[str, str] = {
    "EventedPLEG": (
        "syncloop follows the runtime's container events and relists every 20s; false "
        "relists every second (klet's default is true, upstream's false)"
    ),
    "KubeletFineGrainedAuthz": (
        "the kubelet API authorizes /pods, /runningpods, /healthz and /configz by their "
        "own subresources before falling back to nodes/proxy (default true, as upstream)"
    ),
}


def _go(value: bool) -> str:
    return "true" if value else "false"


def gate_problems(gates: Mapping[str, bool]) -> list[tuple[str, str]]:
    """(field path, message) for every entry of `featureGates` klet refuses."""
    out: list[tuple[str, str]] = []
    for name, value in sorted(gates.items()):
        path = f"featureGates.{name}"
        spec = GATES.get(name)
        if spec is None:
            out.append(
                (
                    path,
                    f"unrecognized feature gate: {name} (klet knows the gates of the "
                    f"Kubernetes {KUBERNETES_VERSION} kubelet)",
                )
            )
            continue
        default, stage, locked = spec
        if locked and value != default:
            out.append(
                (
                    path,
                    f"cannot be set to {_go(value)}: the gate is locked to {_go(default)} "
                    f"in Kubernetes {KUBERNETES_VERSION}",
                )
            )
        elif stage == "PRE-ALPHA":
            out.append((path, f"not available in Kubernetes {KUBERNETES_VERSION}"))
        elif value != default and name not in HONOURED:
            out.append(
                (
                    path,
                    f"not implemented by klet: klet does not act on this gate, so only "
                    f"its default ({_go(default)}) is accepted",
                )
            )
    return out

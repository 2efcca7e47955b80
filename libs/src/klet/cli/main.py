"""`klet` entry point: dispatches to `up`, `run`, `bootstrap`, `crictl`, `events`, `why`,
`gc`, `evict`, `bus-acl`, `cri-proxy`, `healthcheck` and `check-node`; `klet --version` prints the
version (klet.cli.version).

`klet run <service>` finds the service through the `klet.services` entry points, so this
library never imports a service package (the layering contract in pyproject.toml).
"""

from __future__ import annotations

import sys

USAGE = """usage: klet <command> [flags]

commands:
  up [kubelet flags]          run the whole agent on this machine (private Redis, and a
                              private containerd + registry unless
                              --container-runtime-endpoint is given), supervising the services
  run <service> [flags]       run one service: {services}
  bootstrap <service> [flags] only the TLS bootstrap the service would do at start
                              (--bootstrap-kubeconfig, --kubeconfig), then exit
  crictl [--run-dir DIR | --runtime-endpoint EP] pods|ps [-a]|images
                              list what the runtime has, as crictl would
  events [-f] [-n NS | -A] [-o wide|json] [--run-dir DIR | --redis-url URL ...]
                              the node's Events (every service's events stream), as
                              kubectl get events shows them; -f: keep printing new ones
  why <namespace>/<pod> [-o json] [--run-dir DIR | --redis-url URL ...]
                              a pod's history on this node, the answer first: why it
                              restarted, was killed or evicted, or does not start
  gc --dry-run [--threshold PERCENT] [-o json] [--run-dir DIR]
                              what the running image-gc would remove now (dead containers,
                              sandboxes, pod log directories, images) and the bytes each
                              frees; --threshold: at another imageGCHighThresholdPercent
  evict --dry-run [--signal SIGNAL<VALUE ...] [-o json] [--run-dir DIR]
                              what the running eviction service would do now: every signal
                              against its thresholds, the pods in eviction order and why;
                              --signal: for these hard thresholds instead
  bus-acl --node N --secrets-dir DIR [--acl-file FILE] [--apply URL ...]
                              password files and Redis ACL lines of node N's services,
                              and klet's Redis functions, for a bus Redis that klet up
                              does not start (--apply sets them on it as the admin)
  cri-proxy [--container-runtime-endpoint EP] [--run-dir DIR] [--socket-owner S=UID:GID ...]
                              serve <run-dir>/cri/<service>.sock for status-reporter,
                              eviction and image-gc: the runtime's CRI with only the calls
                              each may make (klet.cri.allowlist), others PERMISSION_DENIED
  healthcheck <service>       exit 0 when the service's /healthz on this host passes
                              (container health checks; the port from the replica's
                              KLET_SERVICE_PORT_FILE, else KLET_SERVICE_PORT or its default)
  check-node --node N --kubeconfig FILE
                              exit 0 when Node N is Ready and its Lease is renewed (the
                              chart's helm test)
  --version                   print klet's version and the kubelet release it follows
"""


def services() -> dict[str, object]:
    # Read here, not at import: `klet up`, a long-lived supervisor, never needs the
    # installed distributions' metadata (importlib.metadata and its zipfile, email, csv).
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="klet.services")}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE.format(services=", ".join(sorted(services()))))
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command.partition("=")[0] == "--version":
        from klet.cli.version import split_version_flag, version_line

        try:
            asked, extra = split_version_flag(args)
        except ValueError as err:
            print(f"klet: {err}", file=sys.stderr)
            return 2
        if asked and not extra:
            print(version_line())
            return 0
    if command == "up":
        from klet.cli.up import up

        return up(rest)
    if command == "run":
        found = services()
        if not rest or rest[0] not in found:
            print(
                f"klet run: unknown service {rest[0] if rest else '(none)'!r}; "
                f"one of: {', '.join(sorted(found))}",
                file=sys.stderr,
            )
            return 2
        service_main = found[rest[0]].load()  # type: ignore[attr-defined]
        return int(service_main(rest[1:]) or 0)
    if command == "bootstrap":
        if not rest or rest[0] not in services():
            print(
                f"klet bootstrap: unknown service {rest[0] if rest else '(none)'!r}; "
                f"one of: {', '.join(sorted(services()))}",
                file=sys.stderr,
            )
            return 2
        from klet.cli.service import bootstrap_service

        return bootstrap_service(rest[0], rest[1:])
    if command == "bus-acl":
        from klet.cli.busacl import bus_acl

        return bus_acl(rest)
    if command == "cri-proxy":
        from klet.cli.criproxy import cri_proxy

        return cri_proxy(rest)
    if command == "healthcheck":
        from klet.cli.healthcheck import healthcheck

        return healthcheck(rest)
    if command == "check-node":
        from klet.cli.checknode import check_node_cli

        return check_node_cli(rest)
    if command == "crictl":
        from klet.cli.crictl import crictl

        return crictl(rest)
    if command == "events":
        from klet.cli.events import events

        return events(rest)
    if command == "why":
        from klet.cli.why import why

        return why(rest)
    if command == "gc":
        from klet.cli.dryrun import gc

        return gc(rest)
    if command == "evict":
        from klet.cli.dryrun import evict

        return evict(rest)
    print(
        f"klet: unknown command {command!r}\n"
        + USAGE.format(services=", ".join(sorted(services()))),
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())

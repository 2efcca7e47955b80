"""The one entry sequence every service's `__main__` runs.

Answer `--version` first (klet.cli.version), as upstream does before reading its
configuration. Parse the settings (invalid configuration is refused before anything
starts, every problem listed, exit 1 as upstream's kubelet), refuse a node with swap on
as upstream's kubelet does (`failSwapOn`, `klet.cli.swap`), configure logging, then run
the service's `start(settings)` coroutine in a fresh event loop. Once logging is set up,
each deprecated flag given is logged as a WARNING, and a field whose upstream default
klet does not honour is logged as a WARNING by the service that would act on it
(`klet.config.support.not_honoured`). Before the loop starts, the process's
oom_score_adj is set from `oomScoreAdj` (`klet.cli.oomscore`) and its open-files limit
from `maxOpenFiles` (`klet.cli.rlimits`), here once for all five services, as upstream's
kubelet does at start. A private port file (`--service-port-file`) left by an earlier
run of the same container is removed first thing, so `klet healthcheck` cannot pass on
it while the new process starts (the service port removes it again before binding).
`start` builds the dependencies itself, inside the loop: grpc.aio channels bind to the
loop that exists when they are made. A root task that failed was already logged with its
name and traceback, so it only sets the exit code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from klet.cgroups.fs import detect
from klet.cli.oomscore import apply_oom_score_adj
from klet.cli.rlimits import apply_open_files_limit
from klet.cli.swap import swap_problem
from klet.cli.version import split_version_flag, version_line
from klet.config import ConfigError, Settings, load_settings
from klet.config.support import not_honoured
from klet.obs import RootTaskFailed, configure_logging
from klet.portfiles import remove_port_file

log = logging.getLogger(__name__)

Start = Callable[[Settings], Coroutine[Any, Any, int | None]]


def oom_kill_problem(
    single_process_oom_kill: bool | None, *, cgroup_version: int = 0
) -> str | None:
    """upstream's refusal of `singleProcessOOMKill: false` on cgroup v1, which has no
    memory.oom.group (its OOM killer always takes one process)."""
    if single_process_oom_kill is not False:
        return None
    if (cgroup_version or detect()) == 1:
        return (
            "singleProcessOOMKill: false needs cgroup v2 (memory.oom.group); this host "
            "uses cgroup v1, where an OOM kill always takes a single process"
        )
    return None


def run_service(service: str, argv: list[str] | None, start: Start) -> int:
    try:
        asked, args = split_version_flag(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(f"{service}: {err}", file=sys.stderr)
        return 1
    if asked:
        print(version_line(service))
        return 0
    try:
        settings = load_settings(args, env=os.environ, service=service)
    except ConfigError as err:
        print(f"{service}: {err}", file=sys.stderr)
        return 1
    refusal = swap_problem(settings.kubelet.fail_swap_on) or oom_kill_problem(
        settings.kubelet.single_process_oom_kill
    )
    if refusal is not None:
        print(f"{service}: {refusal}", file=sys.stderr)
        return 1
    remove_port_file(settings.klet.service_port_file)
    configure_logging(
        service=service, verbosity=settings.klet.verbosity, fmt=settings.kubelet.logging.format
    )
    for deprecation in settings.klet.deprecations:
        log.warning(deprecation)
    for warning in not_honoured(settings.kubelet, service=service, standalone=settings.standalone):
        log.warning(warning)
    apply_oom_score_adj(settings.kubelet.oom_score_adj)
    apply_open_files_limit(settings.kubelet.max_open_files)
    try:
        return int(asyncio.run(_bootstrapped(service, settings, start)) or 0)
    except RootTaskFailed:
        return 1


def bootstrap_service(service: str, argv: list[str]) -> int:
    """`klet bootstrap <service> [flags]`: the TLS bootstrap `service` would do at start
    (the same flags, settings and checks), and nothing else: exit 0 once --kubeconfig
    works. The chart runs it in an init container, so the bootstrap kubeconfig (a token
    worth a client certificate for any node name) is mounted there and not in the
    service's own container for its whole life."""

    async def done(settings: Settings) -> int:
        if settings.klet.bootstrap_kubeconfig is None or settings.klet.kubeconfig is None:
            log.error("klet bootstrap needs --bootstrap-kubeconfig and --kubeconfig")
            return 1
        log.info("TLS bootstrap done", extra={"kubeconfig": str(settings.klet.kubeconfig)})
        return 0

    return run_service(service, argv, done)


async def _bootstrapped(service: str, settings: Settings, start: Start) -> int | None:
    """`start`, after TLS bootstrap when --bootstrap-kubeconfig is given (klet.kube.
    bootstrap: a no-op when --kubeconfig already works) and, with rotateCertificates,
    after seeding the client certificate store from a certificate the kubeconfig embeds
    (klet.kube.rotation.seed_store); a failed bootstrap or seeding ends the service with
    its cause logged."""
    bootstrap = settings.klet.bootstrap_kubeconfig
    if bootstrap is not None and settings.klet.kubeconfig is not None:
        from klet.kube.bootstrap import BootstrapError, BootstrapSettings, ensure_client_certificate
        from klet.kube.client import KubeClient
        from klet.kube.settings import KubeSettings

        def connect(path: Path) -> KubeClient:
            return KubeClient(KubeSettings(kubeconfig=path, user_agent=f"klet-{service}"))

        try:
            await ensure_client_certificate(
                BootstrapSettings(
                    kubeconfig=settings.klet.kubeconfig,
                    bootstrap_kubeconfig=bootstrap,
                    cert_dir=settings.klet.cert_dir,
                    node_name=settings.klet.node_name,
                    wait_s=settings.klet.tls_bootstrap_timeout,
                ),
                connect,
            )
        except BootstrapError as err:
            log.error("TLS bootstrap failed", extra={"error": str(err)})
            return 1
    if settings.kubelet.rotate_certificates and settings.klet.kubeconfig is not None:
        # A kubeconfig embedding its client certificate (kubeadm's kubelet.conf) seeds
        # the store the clients present and rotation renews (klet.kube.rotation).
        from klet.kube.bootstrap import BootstrapError
        from klet.kube.rotation import RotationRefused, seed_store

        try:
            await seed_store(settings.klet.kubeconfig, settings.klet.cert_dir)
        except (BootstrapError, RotationRefused) as err:
            log.error("client certificate store not seeded", extra={"error": str(err)})
            return 1
    return await start(settings)

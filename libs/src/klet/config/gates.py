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

Every gate on by default at that version is accounted for in `DEFAULT_ON` (a unit test
walks the generated list and fails on one left out): a feature klet has (`Implemented`,
naming the module and the test that proves it), one klet does not have (`Absent`: klet
holds the gate OFF, a documented difference from upstream, and refuses `true` at start
naming the gate, so it never loads as on while its feature is missing), a gate whose
feature only a refused configuration field could reach (`Inert`), and gates of other
components that no kubelet reads (`OtherComponent`).

Trade-off: the gate list is a generated copy of one release's, so klet refuses a name a
later kubelet knows; that is the kubelet's own behaviour at that version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from klet.config.gatelist import GATES, KUBERNETES_VERSION

__all__ = [
    "DEFAULT_ON",
    "GATES",
    "HONOURED",
    "KUBERNETES_VERSION",
    "Absent",
    "Implemented",
    "Inert",
    "OtherComponent",
    "enabled",
    "gate_problems",
]

# Gates klet reads, with what each changes. Any value of these loads.
HONOURED: Mapping[str, str] = {
    "CPUManagerPolicyAlphaOptions": (
        "the static CPU manager accepts the alpha option distribute-cpus-across-cores "
        "(align-by-socket stays refused by name: the CPU manager's topology hints do not "
        "prefer socket-aligned NUMA node sets); default false, as upstream"
    ),
    "CPUManagerPolicyBetaOptions": (
        "the static CPU manager accepts the beta option strict-cpu-reservation; false "
        "refuses it with upstream's message (default true, as upstream)"
    ),
    "TopologyManagerPolicyBetaOptions": (
        "topologyManagerPolicyOptions accepts the beta option max-allowable-numa-nodes; "
        "false refuses it with upstream's message (default true, as upstream)"
    ),
    "TopologyManagerPolicyOptions": (
        "topologyManagerPolicyOptions is read (prefer-closest-numa-nodes, "
        "max-allowable-numa-nodes); false refuses any option (default true, as upstream)"
    ),
    "DisableCPUQuotaWithExclusiveCPUs": (
        "a container holding exclusive CPUs, and its pod's cgroup, run without a CFS "
        "quota; false keeps the quota (default true, as upstream)"
    ),
    "SystemdWatchdog": (
        "the kubelet entry point (klet.cli.kubelet) pings systemd's watchdog (WATCHDOG=1) "
        "while its services run, when WATCHDOG_USEC is set; false: READY=1 only (default "
        "true, as upstream)"
    ),
    "EventedPLEG": (
        "syncloop follows the runtime's container events and relists every 20s; false "
        "relists every second (klet's default is true, upstream's false)"
    ),
    "KubeletFineGrainedAuthz": (
        "the kubelet API authorizes /pods, /runningpods, /healthz and /configz by their "
        "own subresources before falling back to nodes/proxy (default true, as upstream)"
    ),
    "InPlacePodVerticalScaling": (
        "syncloop applies resizes (pods/resize) in place, or marks them PodResizePending; "
        "false leaves every pod at the resources it started with (default true, as upstream)"
    ),
    "ContainerCheckpoint": (
        "the kubelet API serves POST /checkpoint/{namespace}/{pod}/{container} through CRI "
        "CheckpointContainer (default true, as upstream)"
    ),
    "KubeletPodResourcesGet": (
        "the PodResources API's Get answers one pod; false answers upstream's \"PodResources "
        'API Get method disabled" (default true, as upstream)'
    ),
    "KubeletPodResourcesListUseActivePods": (
        "the PodResources API's List names the active pods; false every pod the sources "
        "gave, terminated ones too (default true, as upstream)"
    ),
    "KubeletPSI": (
        "pressure stall information in /stats/summary and /metrics/cadvisor where the "
        "kernel has it (default true, as upstream)"
    ),
    "KubeletPodResourcesDynamicResources": (
        "the PodResources API's List and Get list each container's prepared DRA claims; "
        "false lists none (default true, as upstream)"
    ),
    "DynamicResourceAllocation": (
        "syncloop prepares pods' ResourceClaims through the DRA drivers (klet.syncloop.dra); "
        "false builds no claim manager, so a pod with resourceClaims waits with "
        "FailedPrepareDynamicResources naming the gate (default true, as upstream)"
    ),
}


@dataclass(frozen=True)
class Implemented:
    """klet has the feature: `module` does it, `test` (a path under tests/) proves it."""

    module: str
    test: str


@dataclass(frozen=True)
class Absent:
    """klet lacks the feature: the gate is off in klet (true is refused at start)."""

    why: str


@dataclass(frozen=True)
class Inert:
    """The feature is reached only through a configuration field klet refuses, so the
    gate changes nothing in any configuration klet loads."""

    field: str


@dataclass(frozen=True)
class OtherComponent:
    """A gate of another component (apiserver, scheduler, controllers, Go client
    libraries): no kubelet reads it."""

    component: str


Account = Implemented | Absent | Inert | OtherComponent

_API = OtherComponent("kube-apiserver")
_SCHED = OtherComponent("kube-scheduler")
_CTRL = OtherComponent("kube-controller-manager")
_CLIENT = OtherComponent("client-go (Go informers and watch lists; klet's client is Python)")

DEFAULT_ON: Mapping[str, Account] = {
    "APIResponseCompression": _API,
    "APIServerIdentity": _API,
    "AggregatedDiscoveryRemoveBetaType": _API,
    "AllowParsingUserUIDFromCertAuth": _API,
    "CPUManagerPolicyBetaOptions": Implemented(
        "klet.syncloop.cpumanager.policy",
        "unit/syncloop/test_cpumanager_policy.py::test_options_as_upstream_reads_them",
    ),
    "ContainerCheckpoint": Implemented(
        "klet.status_reporter.kubeletapi.checkpoint",
        "unit/status_reporter/kubeletapi/test_checkpoint.py::test_checkpoint_asks_the_runtime_for_an_archive_under_root_dir",
    ),
    "ContextualLogging": OtherComponent("Go's klog contextual loggers (klet.obs.logs logs)"),
    "DRAAdminAccess": _API,
    "DRAPrioritizedList": _SCHED,
    "DRAResourceClaimDeviceStatus": _API,
    "DRASchedulerFilterTimeout": _SCHED,
    "DeclarativeValidation": _API,
    "DetectCacheInconsistency": _API,
    "DisableAllocatorDualWrite": _API,
    "DisableCPUQuotaWithExclusiveCPUs": Implemented(
        "klet.syncloop.cpumanager.manager",
        "unit/syncloop/test_cpumanager_criconfig.py::test_exclusive_and_shared_cpusets_reach_the_wire",
    ),
    "DisableNodeKubeProxyVersion": Implemented(
        "klet.status_reporter.cluster.nodestatus",
        "unit/status_reporter/cluster/test_nodestatus.py::test_status_fields",
    ),
    "DynamicResourceAllocation": Implemented(
        "klet.syncloop.dra.manager",
        "unit/syncloop/test_dra_podpath.py::test_a_claim_is_prepared_before_the_sandbox_and_its_cdi_device_reaches_cri",
    ),
    "ExecProbeTimeout": Implemented(
        "klet.syncloop.probing.probes",
        "unit/syncloop/test_handlers.py::test_exec_timeout_and_errors",
    ),
    "ExternalServiceAccountTokenSigner": _API,
    "GracefulNodeShutdown": Implemented(
        "klet.eviction.shutdown",
        "unit/eviction/test_shutdown.py::test_pods_go_to_the_highest_period_at_or_below_their_priority",
    ),
    "GracefulNodeShutdownBasedOnPodPriority": Implemented(
        "klet.eviction.shutdown",
        "unit/eviction/test_shutdown.py::test_pods_go_to_the_highest_period_at_or_below_their_priority",
    ),
    "ImageMaximumGCAge": Implemented(
        "klet.image_gc.imageselect", "unit/image_gc/test_imageselect.py::test_age_victims"
    ),
    "InOrderInformers": _CLIENT,
    "InPlacePodVerticalScaling": Implemented(
        "klet.syncloop.pods.resizing",
        "cluster/test_pod_resize.py::test_resize_in_place_up_and_down",
    ),
    "JobManagedBy": _CTRL,
    "KubeletFineGrainedAuthz": Implemented(
        "klet.status_reporter.kubeletapi.attributes",
        "unit/status_reporter/kubeletapi/test_authz.py::test_fine_grained_falls_back_to_proxy",
    ),
    "KubeletPSI": Implemented(
        "klet.stats.psi", "unit/stats/test_psi.py::test_summary_on_cgroup_v2"
    ),
    "KubeletPodResourcesDynamicResources": Implemented(
        "klet.syncloop.podresources",
        "unit/syncloop/test_podresources.py::test_dynamic_resources_list_a_containers_prepared_claims",
    ),
    "KubeletPodResourcesGet": Implemented(
        "klet.syncloop.podresources",
        "unit/test_rpc_podresources.py::test_get_errors_are_upstreams",
    ),
    "KubeletPodResourcesListUseActivePods": Implemented(
        "klet.syncloop.podresources",
        "unit/syncloop/test_podresources.py::test_list_names_active_pods_and_their_devices",
    ),
    "KubeletSeparateDiskGC": Implemented(
        "klet.eviction.signals", "unit/eviction/test_signals.py::test_fs_observations"
    ),
    "KubeletServiceAccountTokenForCredentialProviders": Implemented(
        "klet.syncloop.containers.credentialplugins",
        "cluster/test_credential_provider_tokens.py::"
        "test_plugin_gets_the_pods_service_account_token",
    ),
    "ListFromCacheSnapshot": _API,
    "LoggingBetaOptions": Inert("logging.options"),
    "MatchLabelKeysInPodTopologySpread": _SCHED,
    "MatchLabelKeysInPodTopologySpreadSelectorMerge": _SCHED,
    "OpenAPIEnums": _API,
    "PodDeletionCost": _CTRL,
    "PodLevelResources": Implemented(
        "klet.model.pod",
        "unit/syncloop/test_pod_level_resources.py::test_pod_level_limits_make_the_pod_cgroup",
    ),
    "PodObservedGenerationTracking": Implemented(
        "klet.syncloop.pods.status",
        "unit/syncloop/test_status.py::test_observed_generation_follows_the_pod_generation",
    ),
    "PodReadyToStartContainersCondition": Implemented(
        "klet.syncloop.pods.status",
        "unit/syncloop/test_status.py::test_running_pod",
    ),
    "PortForwardWebsockets": _API,
    "PreferSameTrafficDistribution": OtherComponent("kube-proxy and the EndpointSlice controller"),
    "PreventStaticPodAPIReferences": Implemented(
        "klet.pod_source.validation",
        "unit/pod_source/test_static_api_references.py::test_each_reference_is_refused_naming_its_field",
    ),
    "ProcMountType": Implemented(
        "klet.syncloop.containers.security",
        "unit/syncloop/test_security.py::test_privileged_readonly_rootfs_and_proc_mount",
    ),
    "ReloadKubeletServerCertificateFile": Implemented(
        "klet.status_reporter.kubeletapi.tlsconfig",
        "unit/status_reporter/kubeletapi/test_tlsconfig.py::test_reload_only_on_change_and_at_most_every_interval",
    ),
    "RemoteRequestHeaderUID": _API,
    "RotateKubeletServerCertificate": Implemented(
        "klet.kube.rotation",
        "cluster/test_tls_bootstrap.py::test_a_node_joins_with_a_bootstrap_token_and_rotates_its_certificate",
    ),
    "SELinuxChangePolicy": Absent("SELinux relabelling of volumes (seLinuxChangePolicy)"),
    "SELinuxMountReadWriteOncePod": Absent("SELinux mount options for volumes"),
    "SchedulerAsyncPreemption": _SCHED,
    "SchedulerPopFromBackoffQ": _SCHED,
    "ServiceAccountNodeAudienceRestriction": _API,
    "SizeBasedListCostEstimate": _API,
    "StatefulSetSemanticRevisionComparison": _CTRL,
    "StorageNamespaceIndex": _API,
    "StorageVersionHash": _API,
    "StructuredAuthenticationConfigurationEgressSelector": _API,
    "SupplementalGroupsPolicy": Implemented(
        "klet.syncloop.containers.security",
        "unit/syncloop/test_security.py::test_fs_group_comes_first_among_supplemental_groups",
    ),
    "SystemdWatchdog": Implemented(
        "klet.cli.sdnotify",
        "unit/test_cli_sdnotify.py::test_the_supervisor_in_system_mode_sends_ready_then_pings",
    ),
    "TokenRequestServiceAccountUIDValidation": _API,
    "TopologyManagerPolicyBetaOptions": Implemented(
        "klet.config.validation", "unit/test_config_memorymanager.py::test_topology_options"
    ),
    "TopologyManagerPolicyOptions": Implemented(
        "klet.syncloop.topologymanager.hints",
        "unit/syncloop/test_topologymanager_hints.py::test_policy_options",
    ),
    "TranslateStreamCloseWebsocketRequests": _API,
    "UnauthenticatedHTTP2DOSMitigation": _API,
    "UserNamespacesSupport": Absent("pod user namespaces (hostUsers: false)"),
    "VolumeAttributesClass": OtherComponent("kube-apiserver and the external CSI resizer"),
    "WatchList": _CLIENT,
    "WindowsGracefulNodeShutdown": OtherComponent("the kubelet on Windows only"),
}


def _klet_default(name: str) -> bool:
    spec = GATES.get(name)
    if spec is None:
        return False
    return spec[0] and not isinstance(DEFAULT_ON.get(name), Absent)


def enabled(gates: Mapping[str, bool], name: str) -> bool:
    """Whether gate `name` is on for klet: as set, else klet's default (upstream's,
    except for `Absent` gates, which klet holds off)."""
    return gates.get(name, _klet_default(name))


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
        elif isinstance(account := DEFAULT_ON.get(name), Absent):
            if value:
                out.append(
                    (
                        path,
                        f"on by default in Kubernetes {KUBERNETES_VERSION}, but klet does not "
                        f"have this feature ({account.why}): klet holds the gate off; set it "
                        f"false or leave it out",
                    )
                )
        elif value != default and name not in HONOURED:
            out.append(
                (
                    path,
                    f"not implemented by klet: klet does not act on this gate, so only "
                    f"its default ({_go(default)}) is accepted",
                )
            )
    return out

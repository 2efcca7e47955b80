"""klet.cri.allowlist: what the CRI proxy passes each reading service. Every call the
three services make through RuntimeClient is allowed to the service that makes it, and
the calls that make, start or reconfigure something (the ones that turn a reader's bug
into root on the node) are refused to all three, naming the method and the service.
`klet cri-proxy` refuses a socket owner it cannot parse or does not serve."""

from __future__ import annotations

import pytest
from klet.cri.allowlist import ALLOWED, FILTERED_SERVICES, refusal

RT = "/runtime.v1.RuntimeService/"
IMG = "/runtime.v1.ImageService/"

# What each service's code calls (RuntimeClient methods, through its managers and
# klet.stats' provider), as gRPC method names.
CALLED = {
    "status-reporter": [
        RT + m
        for m in (
            "Version",
            "Status",
            "ListPodSandbox",
            "ListContainers",
            "ContainerStatus",
            "ListContainerStats",
            "Exec",
            "ExecSync",
            "Attach",
            "PortForward",
            "CheckpointContainer",
        )
    ]
    + [IMG + "ListImages", IMG + "ImageFsInfo"],
    "eviction": [RT + "ListContainerStats", RT + "ListContainers", RT + "ListPodSandbox"]
    + [IMG + "ImageFsInfo"],
    "image-gc": [
        RT + m
        for m in (
            "Status",
            "ListContainers",
            "ListPodSandbox",
            "ListContainerStats",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox",
        )
    ]
    + [IMG + "ListImages", IMG + "RemoveImage", IMG + "ImageFsInfo"],
}

NEVER = [
    RT + "RunPodSandbox",
    RT + "CreateContainer",
    RT + "StartContainer",
    RT + "UpdateRuntimeConfig",
    RT + "UpdateContainerResources",
    RT + "UpdatePodSandboxResources",
    RT + "ReopenContainerLog",
    RT + "GetContainerEvents",
    IMG + "PullImage",
    "/runtime.v1.RuntimeService/SomethingCRIAddsLater",
    "/containerd.services.events.v1.Events/Subscribe",
    "/runtime.v1alpha2.RuntimeService/RunPodSandbox",
]


def test_the_filtered_services_are_the_three_readers() -> None:
    assert set(FILTERED_SERVICES) == {"status-reporter", "eviction", "image-gc"}


@pytest.mark.parametrize(
    ("service", "method"), [(s, m) for s, methods in CALLED.items() for m in methods]
)
def test_what_a_service_calls_passes(service: str, method: str) -> None:
    assert refusal(service, method) is None


@pytest.mark.parametrize(("service", "method"), [(s, m) for s in ALLOWED for m in NEVER])
def test_making_or_starting_anything_is_refused_naming_it(service: str, method: str) -> None:
    why = refusal(service, method)
    assert why is not None
    assert method in why and service in why


def test_only_status_reporter_execs_and_only_image_gc_removes() -> None:
    for method in (RT + "Exec", RT + "Attach", RT + "PortForward", RT + "ExecSync"):
        assert refusal("eviction", method) is not None
        assert refusal("image-gc", method) is not None
    for method in (IMG + "RemoveImage", RT + "RemoveContainer", RT + "StopPodSandbox"):
        assert refusal("status-reporter", method) is not None
        assert refusal("eviction", method) is not None


def test_a_service_without_a_list_gets_nothing() -> None:
    why = refusal("syncloop", RT + "ListContainers")
    assert why is not None and "no allow-list" in why and "syncloop" in why


def test_the_cli_refuses_an_owner_it_does_not_serve_or_cannot_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from klet.cli.criproxy import cri_proxy

    argv = ["--run-dir", "/nonexistent", "--service", "eviction"]
    assert cri_proxy([*argv, "--socket-owner", "image-gc=100:100"]) == 2
    assert "--socket-owner names image-gc, which it does not serve" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cri_proxy([*argv, "--socket-owner", "eviction=alice"])
    assert "want SERVICE=UID:GID" in capsys.readouterr().err


def test_the_cli_refuses_a_socket_path_it_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    from klet.cli.criproxy import cri_proxy

    for bad in ("eviction=relative/cri.sock", "syncloop=/run/x.sock", "eviction"):
        with pytest.raises(SystemExit):
            cri_proxy(["--socket", bad])
        assert "want SERVICE=/ABSOLUTE/PATH" in capsys.readouterr().err
    assert cri_proxy(["--service", "eviction", "--socket", "image-gc=/run/x.sock"]) == 2
    assert "--socket names image-gc, which it does not serve" in capsys.readouterr().err

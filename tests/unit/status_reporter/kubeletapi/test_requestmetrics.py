"""How upstream's kubelet server labels a request in kubelet_http_requests_*: the root of
its path from the server's closed set (anything else "other"), HTTP's eight verbs (anything
else "other"), long_running for exec/attach/debug (not portForward, as upstream)."""

from __future__ import annotations

from klet.status_reporter.kubeletapi.requestmetrics import (
    path_buckets,
    request_labels,
    root_path,
)


def test_roots_and_labels() -> None:
    assert root_path("/metrics/cadvisor") == "metrics/cadvisor"
    assert root_path("/metrics") == "metrics"
    assert root_path("/stats/summary") == "stats"
    assert root_path("/exec/ns/pod/c") == "exec"
    on = path_buckets(debugging=True, checkpoint=True)
    assert request_labels("GET", "/metrics/resource", on) == ("GET", "metrics/resource", "false")
    assert request_labels("GET", "/metrics/slis", on) == ("GET", "other", "false")
    assert request_labels("POST", "/exec/ns/p/c", on) == ("POST", "exec", "true")
    assert request_labels("GET", "/portForward/ns/p", on) == ("GET", "portForward", "false")
    assert request_labels("GET", "/debug/pprof/", on) == ("GET", "debug", "true")
    assert request_labels("BREW", "/nowhere/at/all", on) == ("other", "other", "false")
    assert request_labels("POST", "/checkpoint/ns/p/c", on)[1] == "checkpoint"
    assert (
        request_labels(
            "POST", "/checkpoint/ns/p/c", path_buckets(debugging=True, checkpoint=False)
        )[1]
        == "other"
    )
    off = path_buckets(debugging=False, checkpoint=True)
    assert request_labels("GET", "/configz", off)[1] == "other"
    assert request_labels("GET", "/configz", on)[1] == "configz"
    assert request_labels("GET", "/debug/pprof/", off) == ("GET", "other", "false")
    assert request_labels("GET", "/pprof", off)[1] == "pprof"

"""Generate tools/upstream_metrics.json: every metric the upstream kubelet v1.34.4 serves.

The list is read from the upstream sources in the Go module cache, by upstream's own
static analyser (k8s.io/kubernetes/test/instrumentation, the tool that writes upstream's
metrics documentation) run with `--allstabilityclasses` over the files that declare
component-base metrics, and by a reading of cAdvisor's collector for /metrics/cadvisor.

Which files count: of the packages `go list -deps k8s.io/kubernetes/cmd/kubelet` links,
those of the kubelet itself (cmd/kubelet, pkg/kubelet, pkg/volume, pkg/credentialprovider),
those whose package registers its metrics in an init() (linked means registered), and
the few the kubelet registers by a call (REGISTERED_BY_CALL, each naming the call). The
kube-apiserver's, scheduler's and controller-manager's packages the kubelet links for
shared helpers register nothing in the kubelet and are left out. A file the analyser
cannot decode fails the run, except for the one known expression in pkg/kubelet/metrics
(`DRASubsystem+"_resource_claims_in_use"`), which is given to it as the literal it equals.

cAdvisor's metrics are those of its container and machine collectors whose metric set the
kubelet includes (server.go's includedMetrics, PressureMetrics with KubeletPSI, on by
default at 1.34). The Go runtime's collectors (go_*, process_*) describe the Go process
and are not listed, nor are metrics deprecated before 1.34 (component-base hides a
metric from the minor release after its deprecation). CRI-sourced /metrics/cadvisor
(PodAndContainerStatsFromCRI) is off by default and left out.

Run from the repository root with the Go toolchain (build.sh's module cache):
    .venv/bin/python tools/upstream_metrics.py > tools/upstream_metrics.json
It takes about two minutes (the analyser resolves each file's imports with `go list`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

CLUSTER_MODULE = Path(__file__).resolve().parent / "cluster"
CACHE = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
KUBERNETES = "k8s.io/kubernetes"
KUBELET_OWN = (
    "k8s.io/kubernetes/cmd/kubelet",
    "k8s.io/kubernetes/pkg/kubelet",
    "k8s.io/kubernetes/pkg/volume",
    "k8s.io/kubernetes/pkg/credentialprovider",
)
REGISTERED_BY_CALL = {
    "k8s.io/component-base/metrics/prometheus/feature": "cmd/kubelet/app/server.go: "
    "DefaultMutableFeatureGate.AddMetrics()",
    "k8s.io/component-base/metrics/prometheus/slis": "pkg/kubelet/server/server.go: "
    "slis.SLIMetricsWithReset{}.Install",
    "k8s.io/apiserver/pkg/authorization/authorizerfactory": "the delegating authorizer "
    "of cmd/kubelet/app/auth.go calls RegisterMetrics()",
}
NOT_SERVED = {
    # Declared in kubelet packages but never reaching a kubelet endpoint.
    "pkg/kubelet/metrics/collectors/cri_metrics.go": "PodAndContainerStatsFromCRI is off",
    "pkg/kubelet/apis/config/validation/validation.go": "no metric declared, imports only",
}
ENDPOINTS = (
    ("k8s.io/component-base/metrics/prometheus/slis/", "/metrics/slis"),
    ("k8s.io/kubernetes/pkg/kubelet/prober/", "/metrics/probes"),
    ("k8s.io/kubernetes/pkg/kubelet/metrics/collectors/resource_metrics.go", "/metrics/resource"),
)
CONCAT = re.compile(r'\b([A-Z]\w*)\s*\+\s*"(\w+)"')
GO_ENV = {
    "GOMODCACHE": str(CACHE / "go" / "mod"),
    "GOCACHE": str(CACHE / "go" / "build"),
    "GOTOOLCHAIN": "local",
    "GOFLAGS": "-mod=readonly -buildvcs=false",
    "CGO_ENABLED": "0",
    "GOPROXY": "off",
    "GOWORK": "off",
}


def _go(*args: str) -> str:
    env = {**os.environ, **GO_ENV}
    done = subprocess.run(
        ["go", *args], cwd=CLUSTER_MODULE, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"go {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _packages() -> list[dict[str, Any]]:
    out = _go("list", "-deps", "-json=ImportPath,Dir,GoFiles,Module", f"{KUBERNETES}/cmd/kubelet")
    decoder, packages, at = json.JSONDecoder(), [], 0
    while at < len(out):
        package, at = decoder.raw_decode(out, at)
        packages.append(package)
        while at < len(out) and out[at].isspace():
            at += 1
    return packages


def _registers_in_init(directory: Path, files: list[str]) -> bool:
    for name in files:
        text = (directory / name).read_text()
        init = text.find("func init()")
        if init >= 0 and re.search(r"(MustRegister|RawMustRegister)\(", text[init : init + 800]):
            return True
    return False


def _counted(path: str, directory: Path, files: list[str]) -> bool:
    if path.startswith(KUBELET_OWN):
        return True
    return path in REGISTERED_BY_CALL or _registers_in_init(directory, files)


def _analyse(tool: Path, source: Path, scratch: Path) -> list[dict[str, Any]]:
    text = source.read_text()
    constants = dict(re.findall(r'\b([A-Z]\w*)\s*=\s*"(\w*)"', text))
    literal = CONCAT.sub(
        lambda m: f'"{constants[m[1]]}{m[2]}"' if m[1] in constants else m[0], text
    )
    target = source
    if literal != text:
        target = scratch / source.name
        target.write_text(literal)
    env = {**os.environ, **GO_ENV}
    done = subprocess.run(
        [str(tool), "--allstabilityclasses", str(target)],
        cwd=CLUSTER_MODULE,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{source}: {done.stderr.strip()}")
    found = yaml.safe_load(done.stdout) or []
    assert isinstance(found, list)
    return found


def _hidden(deprecated: str | None) -> bool:
    """component-base hides a metric from the minor release after its deprecation."""
    if not deprecated:
        return False
    major, minor = (int(p) for p in deprecated.split(".")[:2])
    return (major, minor) < (1, 34)


def _full_name(m: dict[str, Any]) -> str:
    return "_".join(p for p in (m.get("namespace"), m.get("subsystem"), m["name"]) if p)


def _component_base(tool: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for package in _packages():
            module = package.get("Module") or {}
            path = package["ImportPath"]
            if not module.get("Path", "").startswith("k8s.io/"):
                continue
            directory = Path(package["Dir"])
            files = package.get("GoFiles") or []
            declaring = [
                f for f in files if '"k8s.io/component-base/metrics"' in (directory / f).read_text()
            ]
            if not declaring or not _counted(path, directory, files):
                continue
            relative = path.removeprefix(f"{KUBERNETES}/")
            for name in declaring:
                where = f"{relative}/{name}"
                if where in NOT_SERVED:
                    continue
                endpoint = next(
                    (e for prefix, e in ENDPOINTS if f"{path}/{name}".startswith(prefix)),
                    "/metrics",
                )
                for m in _analyse(tool, directory / name, Path(scratch)):
                    if _hidden(m.get("deprecatedVersion")):
                        continue
                    rows.append(
                        {
                            "name": _full_name(m),
                            # "custom": a collector's own description, typed per scrape
                            "type": m["type"].lower().removeprefix("timing"),
                            "labels": sorted(m.get("labels") or []),
                            "buckets": m.get("buckets"),
                            "stability": m.get("stabilityLevel", "ALPHA"),
                            "deprecated": m.get("deprecatedVersion"),
                            "endpoint": endpoint,
                            "source": where,
                        }
                    )
    return rows


def _cadvisor() -> list[dict[str, Any]]:
    server = (
        CACHE / "go/mod" / f"{KUBERNETES}@v1.34.4" / "pkg/kubelet/server/server.go"
    ).read_text()
    block = server[server.index("includedMetrics := cadvisormetrics.MetricSet{") :]
    included = set(re.findall(r"cadvisormetrics\.(\w+Metrics):", block[: block.index("}\n")]))
    included.add("PressureMetrics")  # KubeletPSI, on by default at 1.34
    version = re.search(
        r"github.com/google/cadvisor (v[\d.]+)", (CLUSTER_MODULE / "go.mod").read_text()
    )
    assert version
    root = CACHE / "go/mod" / f"github.com/google/cadvisor@{version[1]}" / "metrics"
    rows: list[dict[str, Any]] = []
    for name in ("prometheus.go", "prometheus_machine.go"):
        condition = ""
        namespace = ""
        lines = (root / name).read_text().splitlines()
        for number, line in enumerate(lines):
            has = re.search(r"includedMetrics\.Has\(container\.(\w+)\)", line)
            if has:
                condition = has[1]
            ns = re.search(r'Namespace:\s+"(\w+)"', line)
            if ns:
                namespace = ns[1]
            found = re.search(r'\bname:\s+"(\w+)"', line) or re.search(r'\bName:\s+"(\w+)"', line)
            desc = re.search(r'prometheus\.NewDesc\(\s*"(\w+)"', line)
            if not (found or desc):
                continue
            metric = (found or desc)[1]  # type: ignore[index]
            if found and line.lstrip().startswith("Name:") and namespace:
                metric = f"{namespace}_{metric}"
            if condition and condition not in included:
                continue
            after = "\n".join(lines[number : number + 12])
            kind = "counter" if "CounterValue" in after.split("getValues")[0] else "gauge"
            rows.append(
                {
                    "name": metric,
                    "type": kind,
                    "labels": None,
                    "buckets": None,
                    "stability": "cadvisor",
                    "deprecated": None,
                    "endpoint": "/metrics/cadvisor",
                    "source": f"github.com/google/cadvisor@{version[1]}/metrics/{name}",
                }
            )
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        tool = Path(out) / "instrumentation"
        _go("build", "-o", str(tool), f"{KUBERNETES}/test/instrumentation")
        rows = _component_base(tool) + _cadvisor()
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        unique.setdefault((row["endpoint"], row["name"]), row)
    listed = sorted(unique.values(), key=lambda r: (r["endpoint"], r["name"]))
    json.dump(
        {"kubernetes": "v1.34.4", "generator": "tools/upstream_metrics.py", "metrics": listed},
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

// Command featuregates prints libs/src/klet/config/gatelist.py: every feature gate the
// upstream kubelet of this module's k8s.io/kubernetes version knows, with its default,
// stage and lock at that version. Importing the kubelet's app package registers exactly
// the gates the kubelet binary registers (its own, the apiserver's, client-go's, the
// logging and zpages ones). The version is k8s.io/kubernetes's in go.mod; the specs are
// those in force at its minor version (the kubelet's default emulated version). Run from
// tools/cluster with build.sh's Go environment (GOMODCACHE, GOFLAGS=-mod=readonly):
//
//	go run ./featuregates > ../../libs/src/klet/config/gatelist.py
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"sort"

	"k8s.io/apimachinery/pkg/util/version"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	_ "k8s.io/kubernetes/cmd/kubelet/app" // registers the kubelet's gates
)

func main() {
	release := kubernetesVersion()
	parsed := version.MustParse(release)
	at := version.MajorMinor(parsed.Major(), parsed.Minor())
	all := utilfeature.DefaultMutableFeatureGate.GetAllVersioned()
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, string(name))
	}
	sort.Strings(names)

	fmt.Printf(`"""The feature gates the upstream kubelet %s knows: name -> (default, stage, locked).

Generated from the k8s.io/kubernetes module by tools/cluster/featuregates; do not edit.
Regenerate from tools/cluster, with build.sh's Go environment:
go run ./featuregates > ../../libs/src/klet/config/gatelist.py
Each gate's spec is the one in force at %s. The stage is upstream's: ALPHA, BETA, GA,
DEPRECATED, or PRE-ALPHA (known, but not settable at this version); a locked gate cannot
be set to anything but its default.
"""

from collections.abc import Mapping

KUBERNETES_VERSION = %q

GATES: Mapping[str, tuple[bool, str, bool]] = {
`, release, at.String(), release)
	for _, name := range names {
		spec := specAt(all[featuregate.Feature(name)], at)
		stage := string(spec.PreRelease)
		if stage == "" {
			stage = "GA"
		}
		fmt.Printf("    %q: (%s, %q, %s),\n", name, pyBool(spec.Default), stage, pyBool(spec.LockToDefault))
	}
	fmt.Println("}")
}

// specAt is the spec in force at version `at`: the last one introduced at or before it.
func specAt(specs featuregate.VersionedSpecs, at *version.Version) featuregate.FeatureSpec {
	sorted := append(featuregate.VersionedSpecs(nil), specs...)
	sort.Sort(sorted)
	for i := len(sorted) - 1; i >= 0; i-- {
		if !sorted[i].Version.GreaterThan(at) {
			return sorted[i]
		}
	}
	return featuregate.FeatureSpec{PreRelease: featuregate.PreAlpha}
}

// kubernetesVersion is the k8s.io/kubernetes version this program was built against.
func kubernetesVersion() string {
	info, ok := debug.ReadBuildInfo()
	if ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	fmt.Fprintln(os.Stderr, "featuregates: cannot tell the k8s.io/kubernetes version")
	os.Exit(1)
	return ""
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// Command kubeletflags prints libs/src/klet/config/kubeletflaglist.py: every flag the
// upstream kubelet of this module's k8s.io/kubernetes version accepts on its command line,
// with its type, default and deprecation. It registers them as NewKubeletCommand does
// (KubeletFlags, the KubeletConfiguration flags, the global cadvisor/version/klog flags
// and -h), on one flag set, so hidden and deprecated flags are listed too, which
// `kubelet --help` leaves out. The states klet gives each flag are in klet.cli.kubeletflags,
// not here. Run from tools/cluster with build.sh's Go environment:
//
//	go run ./kubeletflags > ../../libs/src/klet/config/kubeletflaglist.py
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strconv"

	"github.com/spf13/pflag"

	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
)

func main() {
	release := kubernetesVersion()
	fs := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	config, err := options.NewKubeletConfiguration()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeletflags:", err)
		os.Exit(1)
	}
	options.NewKubeletFlags().AddFlags(fs)
	options.AddKubeletConfigFlags(fs, config)
	options.AddGlobalFlags(fs)
	fs.BoolP("help", "h", false, "help for kubelet")

	var flags []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) { flags = append(flags, f) })
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })

	fmt.Printf(`# ruff: noqa: E501
"""Every flag the upstream kubelet %s accepts: name -> UpstreamFlag.

Generated from the k8s.io/kubernetes module by tools/cluster/kubeletflags; do not edit.
Regenerate from tools/cluster, with build.sh's Go environment:
go run ./kubeletflags > ../../libs/src/klet/config/kubeletflaglist.py
Registered as the kubelet's NewKubeletCommand registers them, hidden and deprecated flags
included. "deprecated" is the message upstream prints when the flag is used ("" = not
deprecated); "kind" is pflag's value type.
"""

from collections.abc import Mapping
from typing import NamedTuple

KUBERNETES_VERSION = %q


class UpstreamFlag(NamedTuple):
    """One upstream kubelet flag."""

    kind: str
    shorthand: str
    default: str
    no_value: str  # the value the flag takes when given alone ("" = it needs one)
    deprecated: str
    hidden: bool


FLAGS: Mapping[str, UpstreamFlag] = {
`, release, release)
	for _, f := range flags {
		fmt.Printf("    %s: UpstreamFlag(%s, %s, %s, %s, %s, %s),\n",
			strconv.Quote(f.Name), strconv.Quote(f.Value.Type()), strconv.Quote(f.Shorthand),
			strconv.Quote(f.DefValue), strconv.Quote(f.NoOptDefVal), strconv.Quote(f.Deprecated),
			pyBool(f.Hidden))
	}
	fmt.Println("}")
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
	fmt.Fprintln(os.Stderr, "kubeletflags: cannot tell the k8s.io/kubernetes version")
	os.Exit(1)
	return ""
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

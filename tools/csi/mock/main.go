// Command csi-mock serves the CSI mock driver that Kubernetes' storage e2e suite embeds
// (k8s.io/kubernetes/test/e2e/storage/drivers/csi-test: the Identity, Controller and Node
// services with volumes, snapshots and publications kept in memory, publish and stage
// creating and removing their target directories) on a unix socket of its own, so a node
// agent can be tested against a real CSI server without a cluster.
//
// Why it exists: csi-test v5 no longer ships a mock binary (the mock moved into the e2e
// suite, which serves it from inside e2e.test over a port-forward through hostpathplugin's
// -proxy-endpoint), and a node agent's own tests want it as a process of their own. The
// services and the gRPC server are upstream's; this file only parses flags, listens and
// shuts down on SIGINT/SIGTERM.
//
// It does not register itself with a node agent: upstream's csi-node-driver-registrar
// (tools/csi builds it from its release sources) runs beside it for that, as in the
// suite's CSI Mock pods.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
	mockdriver "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	mockservice "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// version is stamped by build.sh (-X main.version=...): the k8s.io/kubernetes version
// whose mock service this binary serves.
var version = "unknown"

func main() {
	klog.InitFlags(nil)
	endpoint := flag.String("endpoint", os.Getenv("CSI_ENDPOINT"),
		"unix socket to serve CSI on: a path or unix://path (default $CSI_ENDPOINT)")
	driverName := flag.String("drivername", mockservice.Name,
		"driver name returned by GetPluginInfo; the mock also uses it as its node ID")
	attachLimit := flag.Int64("attach-limit", 0, "max_volumes_per_node in NodeGetInfo (0: none)")
	disableAttach := flag.Bool("disable-attach", false,
		"leave out the PUBLISH_UNPUBLISH_VOLUME controller capability (no VolumeAttachment)")
	nodeExpansion := flag.Bool("node-expand-required", false, "advertise EXPAND_VOLUME on the node")
	topology := flag.Bool("enable-topology", false, "advertise VOLUME_ACCESSIBILITY_CONSTRAINTS")
	permissive := flag.Bool("permissive-target-path", false,
		"accept publish target paths whose parent directory does not exist")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()

	if *showVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	path := strings.TrimPrefix(*endpoint, "unix://")
	if path == "" {
		klog.Fatal("no endpoint: pass --endpoint or set CSI_ENDPOINT")
	}
	// A socket left by a previous run would make Listen fail with EADDRINUSE.
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		klog.Fatalf("removing stale socket %s: %v", path, err)
	}
	listener, err := net.Listen("unix", path)
	if err != nil {
		klog.Fatalf("listening on %s: %v", path, err)
	}

	service := mockservice.New(mockservice.Config{
		DriverName:            *driverName,
		AttachLimit:           *attachLimit,
		DisableAttach:         *disableAttach,
		NodeExpansionRequired: *nodeExpansion,
		EnableTopology:        *topology,
		PermissiveTargetPath:  *permissive,
	})
	driver := mockdriver.NewCSIDriver(&mockdriver.CSIDriverServers{
		Controller: service,
		Identity:   service,
		Node:       service,
	})
	// nil: upstream's interceptor, which logs every call as a JSON "gRPCCall:" line at -v=3.
	if err := driver.Start(listener, nil); err != nil {
		klog.Fatalf("starting the CSI server: %v", err)
	}
	klog.Infof("csi-mock %s: driver %s serving CSI on %s", version, *driverName, path)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	sig := <-signals
	klog.Infof("%s: stopping", sig)
	driver.Stop()
	_ = os.Remove(path)
}

// The project's module that builds csi-sanity, csi-test's CSI conformance checker, at the
// version the external-snapshotter and livenessprobe of e2e v1.34.4's manifests require.
// See ../build.sh.
module klet.dev/tools/csi/sanity

go 1.24.0

tool github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity

require (
	github.com/container-storage-interface/spec v1.10.0 // indirect
	github.com/go-logr/logr v1.4.1 // indirect
	github.com/go-task/slim-sprig v0.0.0-20230315185526-52ccab3ef572 // indirect
	github.com/golang/mock v1.6.0 // indirect
	github.com/google/go-cmp v0.6.0 // indirect
	github.com/google/pprof v0.0.0-20210407192527-94a9f03dee38 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kubernetes-csi/csi-test/v5 v5.3.1 // indirect
	github.com/onsi/ginkgo/v2 v2.13.1 // indirect
	github.com/onsi/gomega v1.30.0 // indirect
	golang.org/x/net v0.25.0 // indirect
	golang.org/x/sys v0.20.0 // indirect
	golang.org/x/text v0.15.0 // indirect
	golang.org/x/tools v0.14.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20240528184218-531527333157 // indirect
	google.golang.org/grpc v1.65.0 // indirect
	google.golang.org/protobuf v1.34.1 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
)

"""The CPU manager (upstream pkg/kubelet/cm/cpumanager): none and static policies."""

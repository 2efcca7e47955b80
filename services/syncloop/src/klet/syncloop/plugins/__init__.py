"""Node plugins: the kubelet plugin watcher and the CSI drivers it registers."""

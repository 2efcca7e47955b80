"""Pod volumes: the plugins that make them (emptyDir, hostPath, configMap, ...), the
manager that sets them up and tears them down per pod, and the CRI mounts built from
containers' volumeMounts."""

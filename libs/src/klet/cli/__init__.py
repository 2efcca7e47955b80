"""The `klet` command: `up`, `run <service>`, and `crictl`-style listings."""

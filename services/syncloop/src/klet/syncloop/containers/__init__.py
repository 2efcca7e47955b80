"""One container's life: its CRI configuration, security and resources, image pulls, lifecycle
hooks, termination messages and log rotation.
"""

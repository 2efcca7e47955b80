"""The node's pods as status-reporter sees them, in both modes: the pod view (desired
pods joined with syncloop's statuses), the pure listing rules behind it, and each pod's
history on the bus for `klet why`."""

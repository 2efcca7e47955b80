"""The pod lifecycle: intake from the bus, PLEG, one worker per pod, SyncPod and KillPod, and
the pod status computed and published.
"""

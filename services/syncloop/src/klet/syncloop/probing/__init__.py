"""Liveness, readiness and startup probes: the pure timing decisions, the results cache and the
per-container probe tasks.
"""

"""klet test suites: unit, integration, cluster, and the harness that starts real components."""

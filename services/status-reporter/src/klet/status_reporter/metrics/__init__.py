"""Metrics: status-reporter's own Prometheus instruments (`instruments.py`), and the
node's kubelet metrics served by the kubelet API: the five services' expositions merged
into one (`nodemetrics.py` over the pure `metricsmerge.py`) and `/metrics/cadvisor`
(`containermetrics.py`)."""

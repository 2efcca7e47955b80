"""Flags, KLET_* variables and precedence (klet.config.flags and klet.config.settings).

Covers: precedence flag > config file > default (an absent flag never overrides the file;
--logging-format over the file's logging.format, text by default; the deprecated
--log-format / KLET_LOG_FORMAT between them, each named as deprecated),
upstream value syntaxes (--manifest-url-header multimap, --eviction-hard `<` map, Go
booleans, repeated flags, -v spellings, underscores in flag names), klet-only flags with
their KLET_* variables and defaults, per-service default ports (an unset port is the
service's own, 0 is any free port, `klet up` has none), node name rules, and the
collection of every problem (unknown flags, bad values, bad variables, file problems,
invalid merged values) into one ConfigError naming flag, variable or file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.config import (
    ConfigError,
    KletSettings,
    KubeletConfiguration,
    Settings,
    build_parser,
    load_settings,
)
from klet.model.layout import DEFAULT_SERVICE_PORTS

HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def load(argv: list[str], env: dict[str, str] | None = None, service: str = "syncloop") -> Settings:
    return load_settings(argv, env=env or {}, service=service, hostname="node-1")


def problems(
    argv: list[str], env: dict[str, str] | None = None, hostname: str = "node-1"
) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env=env or {}, service="syncloop", hostname=hostname)
    return info.value.problems


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "kubelet.yaml"
    path.write_text(
        HEADER + "port: 20250\nsyncFrequency: 30s\nstaticPodPath: /etc/file-manifests\n"
    )
    return path


def test_no_flags_gives_defaults() -> None:
    settings = load([])
    assert settings.kubelet == KubeletConfiguration()
    assert settings.klet == KletSettings(service="syncloop", node_name="node-1", service_port=10261)
    assert settings.standalone


def test_klet_only_defaults() -> None:
    klet = load([]).klet
    assert klet.redis_url == "unix:///run/klet/redis/redis.sock"
    assert klet.run_dir == Path("/run/klet")
    assert klet.root_dir == Path("/var/lib/kubelet")
    assert klet.cert_dir == Path("/var/lib/kubelet/pki")
    assert klet.service_bind_address == "127.0.0.1"
    assert klet.verbosity == 0
    assert klet.kubeconfig is None and klet.config_file is None


@pytest.mark.parametrize(("service", "port"), sorted(DEFAULT_SERVICE_PORTS.items()))
def test_service_port_defaults_per_service(service: str, port: int) -> None:
    assert load([], service=service).klet.service_port == port
    assert load(["--service-port", "7000"], service=service).klet.service_port == 7000


@pytest.mark.parametrize("service", sorted(DEFAULT_SERVICE_PORTS))
def test_service_port_zero_is_any_free_port_not_the_default(service: str) -> None:
    assert load(["--service-port", "0"], service=service).klet.service_port == 0
    assert load(["--service-port=0"], service=service).klet.service_port == 0
    assert load([], env={"KLET_SERVICE_PORT": "0"}, service=service).klet.service_port == 0
    # The flag wins over the variable either way.
    env = {"KLET_SERVICE_PORT": "0"}
    assert load(["--service-port", "7000"], env=env, service=service).klet.service_port == 7000
    env = {"KLET_SERVICE_PORT": "7000"}
    assert load(["--service-port", "0"], env=env, service=service).klet.service_port == 0


def test_klet_up_has_no_service_port_of_its_own() -> None:
    assert load([], service="up").klet.service_port is None
    assert load(["--service-port", "0"], service="up").klet.service_port == 0
    # Settings built by hand: not given, as load_settings sees it.
    assert KletSettings(service="syncloop", node_name="n").service_port is None


def test_service_port_file() -> None:
    assert load([]).klet.service_port_file is None
    assert load(["--service-port-file", "/tmp/p.json"]).klet.service_port_file == Path(
        "/tmp/p.json"
    )
    env = {"KLET_SERVICE_PORT_FILE": "/tmp/env.json"}
    assert load([], env=env).klet.service_port_file == Path("/tmp/env.json")
    assert load(["--service-port-file=/tmp/f.json"], env=env).klet.service_port_file == Path(
        "/tmp/f.json"
    )


def test_file_values_apply_when_no_flag(config_file: Path) -> None:
    cfg = load(["--config", str(config_file)]).kubelet
    assert (cfg.port, cfg.sync_frequency, cfg.static_pod_path) == (
        20250,
        30.0,
        "/etc/file-manifests",
    )


def test_flags_override_the_file(config_file: Path) -> None:
    cfg = load(
        ["--config", str(config_file), "--port", "30250", "--pod-manifest-path", "/flag/manifests"]
    ).kubelet
    assert (cfg.port, cfg.sync_frequency, cfg.static_pod_path) == (30250, 30.0, "/flag/manifests")


def test_flag_order_does_not_matter(config_file: Path) -> None:
    assert load(["--port=1", "--config", str(config_file)]).kubelet.port == 1


@pytest.mark.parametrize(
    ("argv", "path", "value"),
    [
        (["--manifest-url", "http://h/pods"], "static_pod_url", "http://h/pods"),
        (["--file-check-frequency", "5s"], "file_check_frequency", 5.0),
        (["--http-check-frequency", "1m"], "http_check_frequency", 60.0),
        (["--sync-frequency", "2m30s"], "sync_frequency", 150.0),
        (
            ["--container-runtime-endpoint", "unix:///run/crio/crio.sock"],
            "container_runtime_endpoint",
            "unix:///run/crio/crio.sock",
        ),
        (
            ["--image-service-endpoint", "unix:///img.sock"],
            "image_service_endpoint",
            "unix:///img.sock",
        ),
        (["--runtime-request-timeout", "10s"], "runtime_request_timeout", 10.0),
        (["--read-only-port", "10255"], "read_only_port", 10255),
        (["--address", "127.0.0.1"], "address", "127.0.0.1"),
        (["--healthz-port", "0"], "healthz_port", 0),
        (["--healthz-bind-address", "0.0.0.0"], "healthz_bind_address", "0.0.0.0"),
        (["--max-pods", "20"], "max_pods", 20),
        (["--pod-logs-dir", "/srv/logs"], "pod_logs_dir", "/srv/logs"),
        (["--cluster-dns", "10.0.0.10,10.0.0.11"], "cluster_dns", ("10.0.0.10", "10.0.0.11")),
        (
            ["--cluster-dns", "10.0.0.10", "--cluster-dns", "fd00::a"],
            "cluster_dns",
            ("10.0.0.10", "fd00::a"),
        ),
        (["--cluster-domain", "cluster.local"], "cluster_domain", "cluster.local"),
        (["--resolv-conf", ""], "resolv_conf", ""),
        (
            ["--tls-cert-file", "/a.crt", "--tls-private-key-file", "/a.key"],
            "tls_cert_file",
            "/a.crt",
        ),
        (["--register-node"], "register_node", True),
        (["--register-node=false"], "register_node", False),
        (["--register-node=0"], "register_node", False),
        (["--register-node=T"], "register_node", True),
        (["--port", "1", "--port", "2"], "port", 2),
        (["--pod_manifest_path=/underscores"], "static_pod_path", "/underscores"),
        (
            ["--feature-gates", "EventedPLEG=false,KubeletFineGrainedAuthz=true"],
            "feature_gates",
            {"EventedPLEG": False, "KubeletFineGrainedAuthz": True},
        ),
        (
            ["--kube-reserved", "cpu=100m,memory=1Gi"],
            "kube_reserved",
            {"cpu": "100m", "memory": "1Gi"},
        ),
        (["--system-reserved-cgroup", "/system.slice"], "system_reserved_cgroup", "/system.slice"),
        (["--kube-reserved-cgroup", "/kube.slice"], "kube_reserved_cgroup", "/kube.slice"),
    ],
)
def test_config_flags(argv: list[str], path: str, value: object) -> None:
    assert getattr(load(argv).kubelet, path) == value


def test_client_ca_file_flag() -> None:
    settings = load(["--client-ca-file", "/etc/ca.crt"])
    assert settings.kubelet.authentication.x509.client_ca_file == "/etc/ca.crt"
    assert settings.client_ca_file == Path("/etc/ca.crt")


def test_manifest_url_header_upstream_syntax() -> None:
    argv = [
        "--manifest-url-header",
        "a:hello,b:again,c:world",
        "--manifest-url-header",
        "b:beautiful",
    ]
    assert load(argv).kubelet.static_pod_url_header == {
        "a": ("hello",),
        "b": ("again", "beautiful"),
        "c": ("world",),
    }


def test_eviction_hard_flag_replaces_the_file_map(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(HEADER + "evictionHard: {memory.available: 1Gi, nodefs.available: 5%}\n")
    argv = [
        "--config",
        str(path),
        "--eviction-hard",
        "memory.available<500Mi",
        "--eviction-hard",
        "pid.available<10%",
    ]
    assert load(argv).kubelet.eviction_hard == {"memory.available": "500Mi", "pid.available": "10%"}


@pytest.mark.parametrize(
    ("argv", "verbosity"),
    [(["-v", "4"], 4), (["-v4"], 4), (["-v=5"], 5), (["--v", "2"], 2), (["--v=3"], 3), ([], 0)],
)
def test_verbosity_spellings(argv: list[str], verbosity: int) -> None:
    assert load(argv).klet.verbosity == verbosity


def test_verbosity_from_file_logging_block(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(HEADER + "logging: {verbosity: 3}\n")
    assert load(["--config", str(path)]).klet.verbosity == 3
    assert load(["--config", str(path), "-v", "1"]).klet.verbosity == 1


def test_agent_flags() -> None:
    klet = load(
        [
            "--kubeconfig",
            "/etc/kubelet.conf",
            "--hostname-override",
            "Worker-7.Example.com",
            "--node-ip",
            "10.0.0.5,fd00::5",
            "--node-labels",
            "role=edge,example.com/zone=a",
            "--root-dir",
            "/srv/kubelet",
            "--cert-dir",
            "/srv/pki",
        ]
    ).klet
    assert klet.kubeconfig == Path("/etc/kubelet.conf") and not klet.standalone
    assert klet.node_name == "worker-7.example.com"
    assert klet.node_ips == ("10.0.0.5", "fd00::5")
    assert klet.node_labels == {"role": "edge", "example.com/zone": "a"}
    assert (klet.root_dir, klet.cert_dir) == (Path("/srv/kubelet"), Path("/srv/pki"))


def test_klet_only_environment_variables() -> None:
    env = {
        "KLET_REDIS_URL": "redis://redis:6380/0",
        "KLET_ALLOW_INSECURE_REDIS": "true",
        "KLET_RUN_DIR": "/tmp/klet-run",
        "KLET_SERVICE_PORT": "9999",
        "KLET_SERVICE_BIND_ADDRESS": "0.0.0.0",
    }
    klet = load([], env=env).klet
    assert klet.redis_url == "redis://redis:6380/0"
    assert klet.run_dir == Path("/tmp/klet-run")
    assert (klet.service_port, klet.service_bind_address) == (9999, "0.0.0.0")


def test_flags_win_over_environment() -> None:
    env = {"KLET_REDIS_URL": "unix:///env.sock", "KLET_SERVICE_PORT": "9999"}
    klet = load(["--redis-url", "unix:///flag.sock", "--service-port", "1234"], env=env).klet
    assert (klet.redis_url, klet.service_port) == ("unix:///flag.sock", 1234)


@pytest.mark.parametrize(
    ("logging", "argv", "env", "expected"),
    [
        # upstream's default, with or without a file
        ("", [], {}, "text"),
        ("logging: {verbosity: 2}\n", [], {}, "text"),
        ("logging: {format: json}\n", [], {}, "json"),
        ("logging: {format: text}\n", [], {}, "text"),
        # upstream's flag wins over the file
        ("logging: {format: text}\n", ["--logging-format", "json"], {}, "json"),
        ("logging: {format: json}\n", ["--logging-format=text"], {}, "text"),
        # the deprecated spellings: over the file, under --logging-format
        ("logging: {format: text}\n", [], {"KLET_LOG_FORMAT": "json"}, "json"),
        ("logging: {format: json}\n", ["--log-format", "text"], {}, "text"),
        ("", ["--log-format", "json"], {"KLET_LOG_FORMAT": "text"}, "json"),
        ("", ["--logging-format", "text", "--log-format", "json"], {}, "text"),
    ],
)
def test_logging_format_flag_file_and_deprecated_spellings(
    tmp_path: Path, logging: str, argv: list[str], env: dict[str, str], expected: str
) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(HEADER + logging)
    settings = load(["--config", str(path), *argv], env=env)
    assert settings.kubelet.logging.format == expected


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, ()),
        (["--logging-format", "json"], {}, ()),
        (
            ["--log-format", "json"],
            {},
            ("--log-format is deprecated: use --logging-format or the configuration's "
             "logging.format",),
        ),
        (
            [],
            {"KLET_LOG_FORMAT": "json"},
            ("KLET_LOG_FORMAT is deprecated: use --logging-format or the configuration's "
             "logging.format",),
        ),
    ],
)  # fmt: skip
def test_deprecated_spellings_are_named(
    argv: list[str], env: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert load(argv, env=env).klet.deprecations == expected


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--logging-format", "xml"], {}, "--logging-format"),
        (["--log-format", "xml"], {}, "--log-format"),
        ([], {"KLET_LOG_FORMAT": "xml"}, "KLET_LOG_FORMAT"),
    ],
)
def test_an_unknown_logging_format_is_refused_naming_its_source(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    assert problems(argv, env=env) == [
        f"{named}: logging.format: must be one of json, text; got 'xml'"
    ]


def test_environment_is_not_read_for_upstream_settings() -> None:
    assert load([], env={"KLET_PORT": "1", "KUBELET_PORT": "2"}).kubelet.port == 10250


def test_every_problem_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(HEADER + "maxPods: -3\nbogusField: 1\nsyncFrequency: soon\n")
    found = problems(
        [
            "--config",
            str(path),
            "--port",
            "http",
            "--max-pods",
            "-1",
            "--unknown-flag",
            "x",
            "--register-node=maybe",
            "--eviction-hard",
            "memory.available=1Gi",
            "--manifest-url-header",
            "novalue",
            "--cluster-dns",
            "not-an-ip",
            "--node-ip",
            "10.0.0.1,10.0.0.2",
            "--log-format",
            "xml",
            "--redis-url",
            "http://x",
            "--service-port",
            "70000",
        ],
        env={"KLET_RUN_DIR": "/ok", "KLET_SERVICE_BIND_ADDRESS": "everywhere"},
        hostname="Bad_Host",
    )
    assert sorted(found) == sorted(
        [
            "unknown flag: --unknown-flag",
            "unexpected argument: x",
            '--register-node: invalid boolean "maybe"',
            "--service-port: must be between 0 and 65535, got 70000",
            '--port: invalid integer "http"',
            '--manifest-url-header: malformed pair "novalue", expected Key:Value',
            '--eviction-hard: malformed pair "memory.available=1Gi", expected signal<value',
            f"{path}: bogusField: unknown field",
            f'{path}: syncFrequency: invalid duration "soon"',
            "--max-pods: maxPods: must not be negative, got -1",
            "--cluster-dns: clusterDNS[0]: invalid IP address 'not-an-ip'",
            "--redis-url: must be a redis://, rediss:// or unix:// URL, got 'http://x'",
            "--log-format: logging.format: must be one of json, text; got 'xml'",
            "KLET_SERVICE_BIND_ADDRESS: invalid IP address 'everywhere'",
            "--node-ip: must be one IP or an IPv4,IPv6 pair",
            "hostname: 'bad_host' is not a valid node name (DNS-1123 subdomain)",
        ]
    )


def test_file_value_problem_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(HEADER + "imageGCHighThresholdPercent: 50\n")
    assert problems(["--config", str(path)]) == [
        f"{path}: imageGCLowThresholdPercent: "
        "must be less than imageGCHighThresholdPercent (80 >= 50)"
    ]


def test_missing_config_file() -> None:
    [problem] = problems(["--config", "/nonexistent/kubelet.yaml"])
    assert problem.startswith("/nonexistent/kubelet.yaml: cannot read:")


def test_bad_environment_value_names_the_variable() -> None:
    assert problems([], env={"KLET_SERVICE_PORT": "x"}) == [
        'KLET_SERVICE_PORT: invalid integer "x"'
    ]


@pytest.mark.parametrize(
    ("argv", "hostname", "expected"),
    [
        ([], "Node-1.Example.COM", "node-1.example.com"),
        (["--hostname-override", " Override "], "ignored", "override"),
    ],
)
def test_node_name_is_lowercased(argv: list[str], hostname: str, expected: str) -> None:
    settings = load_settings(argv, env={}, service="eviction", hostname=hostname)
    assert settings.klet.node_name == expected


def test_invalid_hostname_override_names_the_flag() -> None:
    assert problems(["--hostname-override", "a..b"]) == [
        "--hostname-override: 'a..b' is not a valid node name (DNS-1123 subdomain)"
    ]


def test_missing_flag_value_is_a_config_error() -> None:
    assert problems(["--port"]) == ["argument --port: expected one argument"]


def test_unknown_service_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown service"):
        load_settings([], env={}, service="kube-proxy")


def test_build_parser_is_reusable_and_documents_defaults() -> None:
    parser = build_parser("image-gc")
    text = parser.format_help()
    for flag in ("--pod-manifest-path", "--redis-url", "--service-port", "--logging-format", "--v"):
        assert flag in text
    words = " ".join(text.split())  # argparse wraps the help
    assert "--log-format" in text and "(DEPRECATED: use --logging-format" in words
    assert "--version" in text
    assert "KLET_REDIS_URL" in text and "10264" in text
    assert vars(parser.parse_args([])) == {}  # absent flags leave no trace


def test_the_evented_pleg_relist_period() -> None:
    assert load([]).klet.evented_pleg_relist_period == 20.0
    assert load(["--evented-pleg-relist-period", "2m"]).klet.evented_pleg_relist_period == 120.0
    env = {"KLET_EVENTED_PLEG_RELIST_PERIOD": "30s"}
    assert load([], env=env).klet.evented_pleg_relist_period == 30.0
    assert load(["--feature-gates", "EventedPLEG=false"]).kubelet.feature_gates == {
        "EventedPLEG": False
    }
    assert problems(["--evented-pleg-relist-period", "0s"]) == [
        "--evented-pleg-relist-period: must be a positive duration"
    ]


def test_the_pod_worker_backoff_period() -> None:
    """klet's own flag: upstream's fixed 10 s unless given (the create-failure cluster
    test shortens it to count ten paced attempts quickly)."""
    assert load([]).klet.pod_worker_backoff_period == 10.0
    assert load(["--pod-worker-backoff-period", "2s"]).klet.pod_worker_backoff_period == 2.0
    env = {"KLET_POD_WORKER_BACKOFF_PERIOD": "500ms"}
    assert load([], env=env).klet.pod_worker_backoff_period == 0.5
    assert problems(["--pod-worker-backoff-period", "0s"]) == [
        "--pod-worker-backoff-period: must be a positive duration"
    ]


def test_reserved_memory_flag_takes_upstreams_syntax() -> None:
    settings = load_settings(
        [
            "--reserved-memory",
            "0:memory=1Gi,hugepages-2Mi=2Mi;1:memory=512Mi",
            "--reserved-memory",
            "2:memory=1Gi",
        ],
        env={},
        service="syncloop",
        hostname="n",
    )
    assert settings.kubelet.reserved_memory == (
        {"numaNode": 0, "limits": {"memory": "1Gi", "hugepages-2Mi": "2Mi"}},
        {"numaNode": 1, "limits": {"memory": "512Mi"}},
        {"numaNode": 2, "limits": {"memory": "1Gi"}},
    )
    for value, cause in [
        ("memory=1Gi", "incorrect format"),
        ("x:memory=1Gi", "must be an integer"),
        ("0:cpu=1", "unknown type: 'cpu'"),
        ("0:memory", "type=quantity"),
        ("0:memory=lots", "'lots' is not a quantity"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_settings(["--reserved-memory", value], env={}, service="syncloop", hostname="n")
        [problem] = info.value.problems
        assert problem.startswith("--reserved-memory: ") and cause in problem, problem

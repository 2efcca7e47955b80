"""The settings tree of one klet service, read once at start-up from argv, env and the file.

`load_settings(argv, env=..., service=...)` is the only place that reads flags, `KLET_*`
environment variables and the KubeletConfiguration file. Precedence, as upstream:
an explicit flag > the config file > the default; `KLET_*` variables exist only for
klet-only settings and sit between their flag and their default.

Every problem (unknown flag, bad flag value, bad variable, unreadable or invalid file,
invalid merged value) is collected and raised together as one ConfigError, each naming
the flag, variable, or file and field. A value problem in a field a flag overrode names
the flag; otherwise it names the file.

Trade-off: the node name falls back to the machine's hostname, which is read here (the
caller may pass `hostname=` to keep tests deterministic).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import SplitResult, urlsplit

from klet.config.credentialproviders import CredentialProviderConfig, load_credential_providers
from klet.config.decoding import read_config_file
from klet.config.dropins import apply_drop_ins
from klet.config.errors import ConfigError, Problem
from klet.config.flags import (
    FLAGS,
    add_kubelet_flags,
    apply_to_config,
    convert_flags,
    normalize_argv,
)
from klet.config.kubelet import KubeletConfiguration
from klet.config.validation import validate_problems, with_reserved_system_cpus
from klet.model.layout import DEFAULT_SERVICE_PORTS, UNIX_PATH_MAX, redis_socket, served_sockets

__all__ = [
    "DEFAULT_REDIS_URL",
    "KletSettings",
    "RedisAuth",
    "Settings",
    "build_parser",
    "load_settings",
]

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


DEFAULT_RUN_DIR = Path("/run/klet")
DEFAULT_REDIS_URL = f"unix://{redis_socket(DEFAULT_RUN_DIR)}"
# klet.bus.acl.ADMIN_USER, the set-up credential of the Redis klet starts (not imported:
# klet.bus pulls in redis, and pure modules import this package).
REDIS_ADMIN_USER = "klet-admin"


@dataclasses.dataclass(frozen=True)
class RedisAuth:
    """How a service authenticates to the bus Redis (a `klet.bus.BusAuth`).

    The password is read from `password_file` once, at start-up; it is kept out of the
    settings' repr so no log line of the settings prints it.
    """

    username: str = ""  # --redis-username / KLET_REDIS_USERNAME; "" = Redis's default user
    password_file: Path | None = None  # --redis-password-file / KLET_REDIS_PASSWORD_FILE
    password: str | None = dataclasses.field(default=None, repr=False)  # from the file (or URL)
    ca_file: Path | None = None  # --redis-ca-file: CA of a rediss:// server; None = system's
    cert_file: Path | None = None  # --redis-cert-file: client certificate for rediss://
    key_file: Path | None = None  # --redis-key-file: its private key


@dataclasses.dataclass(frozen=True)
class KletSettings:
    """Settings outside the KubeletConfiguration file: upstream's KubeletFlags and klet's own."""

    service: str  # the service these settings are for ("syncloop", ...)
    node_name: str  # --hostname-override, else the hostname; lowercased DNS-1123 subdomain
    # --redis-url / KLET_REDIS_URL, without user or password (those are in redis_auth)
    redis_url: str = DEFAULT_REDIS_URL
    redis_auth: RedisAuth = RedisAuth()
    allow_insecure_redis: bool = False  # --allow-insecure-redis / KLET_ALLOW_INSECURE_REDIS
    run_dir: Path = DEFAULT_RUN_DIR  # --run-dir / KLET_RUN_DIR: gRPC sockets, pid files
    root_dir: Path = Path("/var/lib/kubelet")  # --root-dir
    cert_dir: Path = Path("/var/lib/kubelet/pki")  # --cert-dir
    node_ip: str = ""  # --node-ip: "", one IP, or "IPv4,IPv6"; "" = detect
    node_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # --node-labels
    # --cloud-provider: "" or "external" (the Node registers tainted uninitialized and its
    # addresses are left to the cloud controller manager); upstream 1.34 refuses any other
    cloud_provider: str = ""
    kubeconfig: Path | None = None  # --kubeconfig; None = standalone
    # --bootstrap-kubeconfig: when --kubeconfig is missing or its certificate expired, a
    # client certificate is requested with this one's credentials and --kubeconfig written
    bootstrap_kubeconfig: Path | None = None
    config_file: Path | None = None  # --config
    # --config-dir: KubeletConfiguration drop-ins (*.conf) merged over --config in lexical
    # order, as upstream (klet.config.dropins); None = none
    config_dir: Path | None = None
    # --service-port / KLET_SERVICE_PORT: 0 = any free port (the kernel picks one);
    # None = not given, the service's default (DEFAULT_SERVICE_PORTS). load_settings
    # resolves None for the five services; it stays None for `klet up`.
    service_port: int | None = None
    # --service-port-file / KLET_SERVICE_PORT_FILE: where this replica writes its port
    # for `klet healthcheck`; None = nowhere.
    service_port_file: Path | None = None
    service_bind_address: str = "127.0.0.1"  # --service-bind-address / KLET_SERVICE_BIND_ADDRESS
    verbosity: int = 0  # -v/--v, else logging.verbosity of the file; klog levels, 4+ = debug
    # Container GC policy (upstream's deprecated KubeletFlags MinimumGCAge,
    # MaxPerPodContainerCount, MaxContainerCount); negative counts mean no limit.
    minimum_container_ttl_duration: float = 0.0  # --minimum-container-ttl-duration, seconds
    maximum_dead_containers_per_container: int = 1  # --maximum-dead-containers-per-container
    maximum_dead_containers: int = -1  # --maximum-dead-containers
    # --evented-pleg-relist-period / KLET_EVENTED_PLEG_RELIST_PERIOD, seconds: syncloop's
    # relist period while runtime events drive PLEG (see klet.syncloop.pods.relisting)
    evented_pleg_relist_period: float = 20.0
    # --pod-worker-backoff-period / KLET_POD_WORKER_BACKOFF_PERIOD, seconds: how long a pod
    # worker waits after a sync that failed in the pod's status (a container that could not
    # be created) before it retries, plus up to half again; upstream's fixed backOffPeriod
    pod_worker_backoff_period: float = 10.0
    tls_bootstrap_timeout: float = 900.0  # --tls-bootstrap-timeout, seconds
    # Each pod's history for `klet why` (status-reporter keeps it on the bus): entries
    # per pod, seconds kept after the last entry, pods kept at most.
    pod_history_max_entries: int = 256  # --pod-history-max-entries
    pod_history_max_age: float = 86400.0  # --pod-history-max-age, seconds
    pod_history_max_pods: int = 1000  # --pod-history-max-pods
    # --image-credential-provider-config and --image-credential-provider-bin-dir, read
    # and validated at load time (klet.config.credentialproviders); None = no plugins.
    credential_providers: CredentialProviderConfig | None = None
    # The deprecated flags or variables given, each as "<name> is deprecated: <what
    # instead>", for the service to log as warnings once its logging is set up.
    deprecations: tuple[str, ...] = ()

    @property
    def standalone(self) -> bool:
        """No apiserver: static pods only, status served on the kubelet API."""
        return self.kubeconfig is None

    @property
    def node_ips(self) -> tuple[str, ...]:
        return tuple(ip for ip in self.node_ip.split(",") if ip)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a service is configured with."""

    kubelet: KubeletConfiguration
    klet: KletSettings

    @property
    def standalone(self) -> bool:
        return self.klet.standalone

    @property
    def client_ca_file(self) -> Path | None:
        """--client-ca-file / authentication.x509.clientCAFile, if set."""
        path = self.kubelet.authentication.x509.client_ca_file
        return Path(path) if path else None


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError([message])


def build_parser(service: str, *, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of every klet flag (upstream names plus klet-only), for `service`.

    Flags are registered with default=SUPPRESS and action="append"; `load_settings`
    converts them. A parse error raises ConfigError.
    """
    port = DEFAULT_SERVICE_PORTS.get(service)
    description = f"klet {service}" + (f" (service port {port})" if port else "")
    parser = _Parser(
        prog=prog or f"klet-{service}",
        description=description,
        # A service's entry point answers it before the flags are parsed (klet.cli.version).
        epilog=(
            "--version: print klet's version and the kubelet release it follows, then exit"
            if port
            else None
        ),
        allow_abbrev=False,
    )
    add_kubelet_flags(parser)
    return parser


def _klet_values(
    flags: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str], list[Problem]]:
    """KletSettings values from flags, then KLET_* variables; also where each came from."""
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    problems: list[Problem] = []
    for spec in FLAGS:
        if spec.setting is None:
            continue
        if spec.flag in flags:
            values[spec.setting] = flags[spec.flag]
            source[spec.setting] = spec.flag
        elif spec.env and spec.env in env:
            try:
                values[spec.setting] = spec.parse([env[spec.env]])
                source[spec.setting] = spec.env
            except ValueError as exc:
                problems.append(Problem(spec.env, str(exc)))
    return values, source, problems


def _split_url(url: str) -> SplitResult:
    """urlsplit, with a malformed URL ("redis://[x") as an empty one instead of ValueError."""
    try:
        return urlsplit(url)
    except ValueError:
        return urlsplit("")


def _database(parts: SplitResult) -> str:
    """The database a bus URL names: the path of redis:// and rediss:// (`/5`), the `db`
    query parameter of any ("" when it names none)."""
    for item in parts.query.split("&"):
        key, _, value = item.partition("=")
        if key == "db":
            return value
    if parts.scheme in ("redis", "rediss"):
        return parts.path.strip("/")
    return ""


def loopback(parts: SplitResult) -> bool:
    """Whether a bus URL names this host over loopback (a password may go there in clear)."""
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_klet(values: Mapping[str, Any], source: Mapping[str, str]) -> list[Problem]:
    problems: list[Problem] = []

    def bad(setting: str, message: str) -> None:
        problems.append(Problem(source.get(setting, setting), message))

    if values.get("minimum_container_ttl_duration", 0.0) < 0:
        # upstream's NewContainerGC refuses a negative age the same way
        bad(
            "minimum_container_ttl_duration",
            f"invalid minimum garbage collection age: {values['minimum_container_ttl_duration']}s",
        )
    if values.get("evented_pleg_relist_period", 20.0) <= 0:
        bad("evented_pleg_relist_period", "must be a positive duration")
    if values.get("pod_worker_backoff_period", 10.0) <= 0:
        bad("pod_worker_backoff_period", "must be a positive duration")
    if values.get("tls_bootstrap_timeout", 900.0) <= 0:
        bad("tls_bootstrap_timeout", "must be a positive duration")
    if values.get("pod_history_max_age", 86400.0) <= 0:
        bad("pod_history_max_age", "must be a positive duration")
    for name in ("pod_history_max_entries", "pod_history_max_pods"):
        if values.get(name, 1) < 1:
            bad(name, f"must be at least 1, got {values[name]}")
    if values.get("bootstrap_kubeconfig") and not values.get("kubeconfig"):
        bad(
            "bootstrap_kubeconfig",
            "needs --kubeconfig: the path the kubeconfig for the issued certificate is written to",
        )
    if "service_bind_address" in values:
        try:
            ipaddress.ip_address(values["service_bind_address"])
        except ValueError:
            bad("service_bind_address", f"invalid IP address {values['service_bind_address']!r}")
    if values.get("cloud_provider", "") not in ("", "external"):
        # upstream's cloudprovider.ErrorForDisabledProvider, word for word in meaning
        bad(
            "cloud_provider",
            f"cloud provider {values['cloud_provider']!r} was specified, but built-in cloud "
            "providers are disabled (as in upstream v1.34): set --cloud-provider=external and "
            "run the provider's cloud controller manager",
        )
    if values.get("node_ip"):
        try:
            ips = [ipaddress.ip_address(ip) for ip in values["node_ip"].split(",")]
        except ValueError:
            bad("node_ip", f"invalid IP address list {values['node_ip']!r}")
        else:
            if len(ips) > 2 or (len(ips) == 2 and ips[0].version == ips[1].version):
                bad("node_ip", "must be one IP or an IPv4,IPv6 pair")
    run_dir = Path(values.get("run_dir", KletSettings.run_dir))
    root_dir = Path(values.get("root_dir", KletSettings.root_dir))
    too_long: dict[str, Path] = {}
    for path in served_sockets(run_dir, root_dir):
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            too_long.setdefault("root_dir" if path.is_relative_to(root_dir) else "run_dir", path)
    for setting, path in too_long.items():
        bad(
            setting,
            f"too long for the unix sockets under it: {path} is {len(os.fsencode(path))} "
            f"bytes, a socket path holds at most {UNIX_PATH_MAX}",
        )
    for key, value in values.get("node_labels", {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not _DNS1123_SUBDOMAIN.fullmatch(prefix)) or not (
            len(name) <= 63 and _LABEL_NAME.fullmatch(name)
        ):
            bad("node_labels", f"invalid label key {key!r}")
        if value and not (len(value) <= 63 and _LABEL_NAME.fullmatch(value)):
            bad("node_labels", f"invalid value {value!r} of label {key!r}")
    return problems


def _read_secret(path: Path) -> str:
    text = path.read_text()
    return text.splitlines()[0] if text else ""


def _redis(
    values: Mapping[str, Any], source: Mapping[str, str]
) -> tuple[str, RedisAuth, list[Problem]]:
    """The bus URL without credentials, how to authenticate, and what is wrong.

    A password must not be in `--redis-url` (every user can read a process's command
    line in /proc); KLET_REDIS_URL may carry one (a process's environment is readable
    by its owner and root only). A TCP URL is refused without credentials, unless the
    operator says --allow-insecure-redis: whoever writes the bus runs pods as root. So
    is a password sent in clear text (redis://) to anything but a loopback address: it
    could be read on the way, and whoever sits there could write the bus. The URL may
    name database 0 only: klet's ACL users may not SELECT another.
    """
    problems: list[Problem] = []

    def bad(setting: str, message: str) -> None:
        problems.append(Problem(source.get(setting, setting), message))

    url = values.get("redis_url", DEFAULT_REDIS_URL)
    parts = _split_url(url)
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.netloc or parts.path):
        bad("redis_url", f"must be a redis://, rediss:// or unix:// URL, got {url!r}")
        return url, RedisAuth(), problems
    _, at, hostport = parts.netloc.rpartition("@")
    # Rebuilt by hand: urlunsplit drops the "//" of an empty netloc (unix:///path).
    query = f"?{parts.query}" if parts.query else ""
    bare = f"{parts.scheme}://{hostport}{parts.path}{query}" if at else url
    url_user = parts.username or ""
    password: str | None = parts.password or None
    if password is not None and source.get("redis_url") == "--redis-url":
        bad(
            "redis_url",
            "must not contain a password: every user can read it in /proc/<pid>/cmdline; "
            "put it in a file and give --redis-password-file",
        )
    username = values.get("redis_username", "")
    if url_user and username and url_user != username:
        bad("redis_username", f"{username!r} differs from the user {url_user!r} in the URL")
    username = username or url_user
    if username == REDIS_ADMIN_USER:
        bad(
            "redis_username" if values.get("redis_username") else "redis_url",
            f"{REDIS_ADMIN_USER} is the set-up credential of klet's Redis, not for a "
            "service: give this service its own user (klet bus-acl)",
        )
    password_file = _optional_path(values.get("redis_password_file"))
    if password_file is not None:
        if password is not None:
            bad("redis_password_file", "the URL carries a password already; give it once")
        try:
            password = _read_secret(password_file)
        except (OSError, UnicodeDecodeError) as exc:
            bad("redis_password_file", f"cannot read {password_file}: {exc}")
        else:
            if not password:
                bad("redis_password_file", f"{password_file} is empty")
    tls = {
        name: _optional_path(values.get(name))
        for name in ("redis_ca_file", "redis_cert_file", "redis_key_file")
    }
    for name, path in tls.items():
        if path is None:
            continue
        if parts.scheme != "rediss":
            bad(name, f"is for a rediss:// URL only, but the bus URL is {bare!r}")
        elif not path.is_file():
            bad(name, f"{path} is not a readable file")
    if (tls["redis_cert_file"] is None) != (tls["redis_key_file"] is None):
        given = "redis_cert_file" if tls["redis_cert_file"] is not None else "redis_key_file"
        bad(given, "--redis-cert-file and --redis-key-file go together")
    insecure_ok = bool(values.get("allow_insecure_redis", False))
    database = _database(parts)
    if database not in ("", "0"):
        bad(
            "redis_url",
            f"names database {database!r}: klet keeps its keys in database 0 and its ACL "
            "users may not SELECT another (several nodes share one database by key prefix)",
        )
    if parts.scheme == "redis" and password and not insecure_ok and not loopback(parts):
        bad(
            "redis_url",
            f"{bare} would carry the password in clear text to a host that is not this "
            "machine, and whoever sits in between could read it and write the bus: use "
            "rediss:// (--redis-ca-file), or pass --allow-insecure-redis",
        )
    if (
        parts.scheme in ("redis", "rediss")
        and not password
        and tls["redis_cert_file"] is None
        and not insecure_ok
    ):
        bad(
            "redis_url",
            f"{bare} is a TCP Redis without credentials: anyone who can reach it can run "
            "pods as root on this node; give --redis-username and --redis-password-file "
            "(or a client certificate for rediss://), use a unix:// socket, or pass "
            "--allow-insecure-redis",
        )
    auth = RedisAuth(
        username=username,
        password_file=password_file,
        password=password,
        ca_file=tls["redis_ca_file"],
        cert_file=tls["redis_cert_file"],
        key_file=tls["redis_key_file"],
    )
    return bare, auth, problems


def _node_name(values: Mapping[str, Any], hostname: str | None) -> tuple[str, Problem | None]:
    raw = values.get("node_name") or hostname or socket.gethostname()
    name = raw.strip().lower()
    where = "--hostname-override" if values.get("node_name") else "hostname"
    if not name:
        return name, Problem(where, "the node name is empty")
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        return name, Problem(where, f"{name!r} is not a valid node name (DNS-1123 subdomain)")
    return name, None


def _overriding_flag(problem: Problem, overridden: Mapping[str, str]) -> str | None:
    """The flag that set the field at the problem's path (or a parent of it), else the
    flag that set a field the message names: a cross-field rule ("tlsCertFile and
    tlsPrivateKeyFile must be set together") reported on the field no flag set was
    still caused by the flag."""
    path = problem.path
    for field, flag in overridden.items():
        if path == field or path.startswith((field + ".", field + "[")):
            return flag
    for field, flag in overridden.items():
        if re.search(rf"(?<![\w.]){re.escape(field)}(?![\w])", problem.message):
            return flag
    return None


def _optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _credential_providers(
    values: Mapping[str, Any],
) -> tuple[CredentialProviderConfig | None, list[Problem]]:
    """The plugins of --image-credential-provider-config, as upstream: either flag given
    means both are needed, the file is read and checked now, and any problem stops."""
    config = _optional_path(values.get("image_credential_provider_config"))
    bin_dir = _optional_path(values.get("image_credential_provider_bin_dir"))
    if config is None and bin_dir is None:
        return None, []
    if config is None:
        return None, [
            Problem(
                "--image-credential-provider-bin-dir",
                "needs --image-credential-provider-config (the plugins to run)",
            )
        ]
    if bin_dir is None:
        return None, [
            Problem(
                "--image-credential-provider-config",
                "needs --image-credential-provider-bin-dir (where the plugins are)",
            )
        ]
    return load_credential_providers(config, bin_dir)


def load_settings(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    service: str,
    hostname: str | None = None,
) -> Settings:
    """Parse `argv` (without the program name), read the --config file, apply the flags
    over it and validate the result.

    Raises ConfigError listing every problem; ValueError for an unknown `service`.
    """
    if service not in DEFAULT_SERVICE_PORTS and service != "up":
        known = ", ".join([*DEFAULT_SERVICE_PORTS, "up"])
        raise ValueError(f"unknown service {service!r} (one of {known})")
    parser = build_parser(service)
    namespace, extra = parser.parse_known_args(normalize_argv(argv))
    problems = [
        Problem(
            "", f"unknown flag: {arg}" if arg.startswith("-") else f"unexpected argument: {arg}"
        )
        for arg in extra
    ]
    flags, flag_problems = convert_flags(namespace)
    problems += flag_problems
    klet_values, source, env_problems = _klet_values(flags, env)
    problems += env_problems

    config_file = _optional_path(klet_values.get("config_file"))
    if config_file is not None:
        cfg, file_problems = read_config_file(config_file)
        problems += [Problem(str(config_file), str(p)) for p in file_problems]
    else:
        cfg = KubeletConfiguration()
    config_dir = _optional_path(klet_values.get("config_dir"))
    drop_ins = None
    if config_dir is not None:
        drop_ins = apply_drop_ins(cfg, config_dir)
        cfg = drop_ins.config
        problems += drop_ins.problems
    cfg, overridden = apply_to_config(cfg, flags)
    if "log_format" in klet_values and "--logging-format" not in flags:
        # The deprecated --log-format / KLET_LOG_FORMAT: over the file, under the flag.
        logging = dataclasses.replace(cfg.logging, format=klet_values["log_format"])
        cfg = dataclasses.replace(cfg, logging=logging)
        overridden["logging.format"] = source["log_format"]
    for problem in validate_problems(cfg):
        flag = _overriding_flag(problem, overridden)
        drop_in = drop_ins.file_for(problem.path) if drop_ins is not None else None
        if flag is not None:
            problems.append(Problem(flag, str(problem)))
        elif drop_in is not None:
            problems.append(Problem(str(drop_in), str(problem)))
        elif config_file is not None:
            problems.append(Problem(str(config_file), str(problem)))
        else:
            problems.append(problem)

    problems += _check_klet(klet_values, source)
    if cfg.server_tls_bootstrap:
        where = overridden.get("serverTLSBootstrap") or str(config_file or "serverTLSBootstrap")
        if not klet_values.get("kubeconfig"):
            problems.append(
                Problem(where, "serverTLSBootstrap: needs --kubeconfig (the certificates API)")
            )
        if cfg.tls_cert_file or cfg.tls_private_key_file:
            problems.append(
                Problem(
                    where,
                    "serverTLSBootstrap: the serving certificate comes from the certificates "
                    "API; tlsCertFile and tlsPrivateKeyFile would not be used: set one or the "
                    "other",
                )
            )
    credential_providers, provider_problems = _credential_providers(klet_values)
    problems += provider_problems
    redis_url, redis_auth, redis_problems = _redis(klet_values, source)
    problems += redis_problems
    node_name, name_problem = _node_name(klet_values, hostname)
    if name_problem is not None:
        problems.append(name_problem)
    if problems:
        raise ConfigError([str(p) for p in problems])
    cfg = with_reserved_system_cpus(cfg)

    # An absent flag and variable leave no value: the service's default port. 0 is a
    # value (any free port). `klet up` validates the flags its services get; it has no
    # service port of its own, so an unset one stays None there.
    port: int | None = klet_values.get("service_port", DEFAULT_SERVICE_PORTS.get(service))
    klet = KletSettings(
        service=service,
        node_name=node_name,
        redis_url=redis_url,
        redis_auth=redis_auth,
        allow_insecure_redis=bool(klet_values.get("allow_insecure_redis", False)),
        run_dir=Path(klet_values.get("run_dir", KletSettings.run_dir)),
        root_dir=Path(klet_values.get("root_dir", KletSettings.root_dir)),
        cert_dir=Path(klet_values.get("cert_dir", KletSettings.cert_dir)),
        node_ip=klet_values.get("node_ip", ""),
        node_labels=dict(klet_values.get("node_labels", {})),
        cloud_provider=klet_values.get("cloud_provider", ""),
        kubeconfig=_optional_path(klet_values.get("kubeconfig")),
        bootstrap_kubeconfig=_optional_path(klet_values.get("bootstrap_kubeconfig")),
        config_file=config_file,
        config_dir=config_dir,
        service_port=port,
        service_port_file=_optional_path(klet_values.get("service_port_file")),
        service_bind_address=klet_values.get(
            "service_bind_address", KletSettings.service_bind_address
        ),
        verbosity=klet_values.get("verbosity", cfg.logging.verbosity),
        minimum_container_ttl_duration=klet_values.get(
            "minimum_container_ttl_duration", KletSettings.minimum_container_ttl_duration
        ),
        maximum_dead_containers_per_container=klet_values.get(
            "maximum_dead_containers_per_container",
            KletSettings.maximum_dead_containers_per_container,
        ),
        maximum_dead_containers=klet_values.get(
            "maximum_dead_containers", KletSettings.maximum_dead_containers
        ),
        tls_bootstrap_timeout=klet_values.get(
            "tls_bootstrap_timeout", KletSettings.tls_bootstrap_timeout
        ),
        pod_history_max_entries=klet_values.get(
            "pod_history_max_entries", KletSettings.pod_history_max_entries
        ),
        pod_history_max_age=klet_values.get(
            "pod_history_max_age", KletSettings.pod_history_max_age
        ),
        pod_history_max_pods=klet_values.get(
            "pod_history_max_pods", KletSettings.pod_history_max_pods
        ),
        evented_pleg_relist_period=klet_values.get(
            "evented_pleg_relist_period", KletSettings.evented_pleg_relist_period
        ),
        pod_worker_backoff_period=klet_values.get(
            "pod_worker_backoff_period", KletSettings.pod_worker_backoff_period
        ),
        credential_providers=credential_providers,
        deprecations=tuple(
            f"{source[spec.setting]} is deprecated: {spec.deprecated}"
            for spec in FLAGS
            if spec.deprecated and spec.setting in source
        ),
    )
    return Settings(kubelet=cfg, klet=klet)

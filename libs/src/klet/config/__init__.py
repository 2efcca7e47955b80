"""klet.config: the kubelet configuration file, kubelet-named flags and klet's own settings.

Services call `load_settings(sys.argv[1:], env=os.environ, service="syncloop")` once at
start-up and pass the resulting frozen `Settings` down; nothing else reads flags, the
environment or the file. See kubelet.py for the file format, flags.py for the flags and
settings.py for precedence.
"""

from klet.config.decoding import decode_config, load_config_file, read_config_file
from klet.config.errors import ConfigError, Problem
from klet.config.flags import (
    FLAGS,
    FlagSpec,
    add_kubelet_flags,
    apply_to_config,
    convert_flags,
)
from klet.config.kubelet import (
    API_VERSION,
    DEFAULT_EVICTION_HARD,
    KIND,
    CrashLoopBackOffConfig,
    KubeletAnonymousAuthentication,
    KubeletAuthentication,
    KubeletAuthorization,
    KubeletConfiguration,
    KubeletWebhookAuthentication,
    KubeletWebhookAuthorization,
    KubeletX509Authentication,
    LoggingConfiguration,
    MemorySwapConfiguration,
    TracingConfiguration,
    UserNamespaces,
    upstream_name,
)
from klet.config.settings import KletSettings, RedisAuth, Settings, build_parser, load_settings
from klet.config.validation import EVICTION_SIGNALS, validate, validate_problems
from klet.model.units import (
    format_duration,
    parse_duration,
    parse_percentage,
    parse_quantity,
    parse_quantity_int,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_EVICTION_HARD",
    "EVICTION_SIGNALS",
    "FLAGS",
    "KIND",
    "ConfigError",
    "CrashLoopBackOffConfig",
    "FlagSpec",
    "KletSettings",
    "RedisAuth",
    "KubeletAnonymousAuthentication",
    "KubeletAuthentication",
    "KubeletAuthorization",
    "KubeletConfiguration",
    "KubeletWebhookAuthentication",
    "KubeletWebhookAuthorization",
    "KubeletX509Authentication",
    "LoggingConfiguration",
    "MemorySwapConfiguration",
    "Problem",
    "Settings",
    "TracingConfiguration",
    "UserNamespaces",
    "add_kubelet_flags",
    "apply_to_config",
    "build_parser",
    "convert_flags",
    "decode_config",
    "format_duration",
    "load_config_file",
    "load_settings",
    "parse_duration",
    "parse_percentage",
    "parse_quantity",
    "parse_quantity_int",
    "read_config_file",
    "upstream_name",
    "validate",
    "validate_problems",
]

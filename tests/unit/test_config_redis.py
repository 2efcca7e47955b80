"""The bus connection settings (klet.config.settings, `_redis`).

Covers: a TCP Redis URL without credentials is refused at start naming --redis-url and
the way out (--allow-insecure-redis, a password file, a unix socket); the password comes
from --redis-password-file and never from --redis-url (which every local user can read
in /proc/<pid>/cmdline), but KLET_REDIS_URL may carry one; the URL kept in the settings
has no credentials in it; TLS files only with rediss://; the password stays out of the
settings' repr; a password over plain redis:// only to a loopback address (or with
--allow-insecure-redis); a URL naming a database other than 0 is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.bus.acl import ADMIN_USER
from klet.config import ConfigError, Settings, load_settings
from klet.config.settings import REDIS_ADMIN_USER


def load(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return load_settings(argv, env=env or {}, service="syncloop", hostname="node-1")


def problems(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(argv, env)
    return info.value.problems


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text("s3cret-pw\n")
    return path


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://redis.example:6380/0"])
def test_tcp_url_without_credentials_is_refused(url: str) -> None:
    (problem,) = problems(["--redis-url", url])
    assert problem.startswith("--redis-url: ")
    assert "without credentials" in problem
    assert "--allow-insecure-redis" in problem and "--redis-password-file" in problem


def test_tcp_url_from_the_environment_is_refused_naming_the_variable() -> None:
    (problem,) = problems([], env={"KLET_REDIS_URL": "redis://10.0.0.5:6379/0"})
    assert problem.startswith("KLET_REDIS_URL: ")


def test_allow_insecure_redis_accepts_it() -> None:
    klet = load(["--redis-url", "redis://127.0.0.1:6379/0", "--allow-insecure-redis"]).klet
    assert klet.allow_insecure_redis
    assert klet.redis_url == "redis://127.0.0.1:6379/0"
    assert klet.redis_auth.password is None


def test_unix_socket_needs_no_credentials() -> None:
    klet = load([]).klet
    assert klet.redis_url == "unix:///run/klet/redis/redis.sock"
    assert (klet.redis_auth.username, klet.redis_auth.password) == ("", None)


def test_password_comes_from_the_file(password_file: Path) -> None:
    klet = load(
        [
            "--redis-url",
            "rediss://10.0.0.5:6379/0",
            "--redis-username",
            "klet-syncloop@node-1",
            "--redis-password-file",
            str(password_file),
        ]
    ).klet
    assert klet.redis_auth.username == "klet-syncloop@node-1"
    assert klet.redis_auth.password == "s3cret-pw"
    assert "s3cret-pw" not in repr(klet)


def test_password_in_the_url_flag_is_refused() -> None:
    (problem,) = problems(["--redis-url", "rediss://u:hunter2@10.0.0.5:6379/0"])
    assert problem.startswith("--redis-url: must not contain a password")


def test_password_in_the_environment_url_is_moved_out_of_the_url() -> None:
    klet = load([], env={"KLET_REDIS_URL": "rediss://u:hunter2@redis.example:6380/0"}).klet
    assert klet.redis_url == "rediss://redis.example:6380/0"
    assert (klet.redis_auth.username, klet.redis_auth.password) == ("u", "hunter2")


def test_unix_url_with_credentials_in_the_environment() -> None:
    env = {"KLET_REDIS_URL": "unix://klet-syncloop@n1:pw@/run/redis/redis.sock?db=0"}
    klet = load([], env=env).klet
    assert klet.redis_url == "unix:///run/redis/redis.sock?db=0"
    assert (klet.redis_auth.username, klet.redis_auth.password) == ("klet-syncloop@n1", "pw")


def test_unreadable_or_empty_password_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    (problem,) = problems(["--redis-password-file", str(missing)])
    assert problem.startswith(f"--redis-password-file: cannot read {missing}")
    empty = tmp_path / "empty"
    empty.write_text("")
    (problem,) = problems(["--redis-password-file", str(empty)])
    assert problem == f"--redis-password-file: {empty} is empty"


def test_tls_files_need_rediss(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    (problem,) = problems(["--redis-ca-file", str(ca)])
    assert problem.startswith("--redis-ca-file: is for a rediss:// URL only")


def test_client_certificate_counts_as_credentials(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    cert.write_text("x")
    key.write_text("x")
    klet = load(
        [
            "--redis-url",
            "rediss://redis.example:6380/0",
            "--redis-cert-file",
            str(cert),
            "--redis-key-file",
            str(key),
        ]
    ).klet
    assert (klet.redis_auth.cert_file, klet.redis_auth.key_file) == (cert, key)
    assert problems(["--redis-url", "rediss://r:6380/0", "--redis-cert-file", str(cert)]) == [
        "--redis-cert-file: --redis-cert-file and --redis-key-file go together"
    ]


def test_the_admin_user_is_not_for_services(password_file: Path) -> None:
    (problem,) = problems(
        ["--redis-username", "klet-admin", "--redis-password-file", str(password_file)]
    )
    assert problem.startswith("--redis-username: klet-admin is the set-up credential")
    (problem,) = problems([], env={"KLET_REDIS_URL": "unix://klet-admin:pw@/r.sock"})
    assert problem.startswith("KLET_REDIS_URL: klet-admin is the set-up credential")
    assert REDIS_ADMIN_USER == ADMIN_USER


def test_a_cleartext_password_off_loopback_is_refused(password_file: Path) -> None:
    flags = ["--redis-username", "u", "--redis-password-file", str(password_file)]
    (problem,) = problems(["--redis-url", "redis://10.0.0.5:6379", *flags])
    assert problem.startswith("--redis-url: redis://10.0.0.5:6379 would carry the password")
    assert "rediss://" in problem and "--allow-insecure-redis" in problem
    for url in ("redis://127.0.0.1:6379", "redis://localhost:6379", "redis://[::1]:6379"):
        assert load(["--redis-url", url, *flags]).klet.redis_auth.password == "s3cret-pw"
    insecure = load(["--redis-url", "redis://10.0.0.5:6379", *flags, "--allow-insecure-redis"])
    assert insecure.klet.redis_auth.password == "s3cret-pw"
    assert load(["--redis-url", "rediss://10.0.0.5:6379", *flags]).klet.redis_url


@pytest.mark.parametrize(
    "url",
    ["rediss://redis.example:6380/5", "unix:///run/redis.sock?db=3", "rediss://r:1/0?db=2"],
)
def test_a_database_other_than_0_is_refused(url: str, password_file: Path) -> None:
    flags = ["--redis-username", "u", "--redis-password-file", str(password_file)]
    (problem,) = problems(["--redis-url", url, *flags])
    assert "names database" in problem and "may not SELECT" in problem


@pytest.mark.parametrize("url", ["rediss://redis.example:6380/0", "unix:///s.sock?db=0"])
def test_database_0_may_be_named(url: str, password_file: Path) -> None:
    flags = ["--redis-username", "u", "--redis-password-file", str(password_file)]
    assert load(["--redis-url", url, *flags]).klet.redis_url == url

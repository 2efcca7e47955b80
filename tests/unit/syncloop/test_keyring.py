"""The keyring as upstream's credentialprovider: image names normalised (Docker Hub's
`library/`, `index.docker.io` ≡ `docker.io`, the `:latest` default, invalid names);
docker configurations parsed from config.json, .dockercfg and both pull-secret types
(`auth` padded or not, case-insensitive fields); locations matched by port, host parts
with globs, path prefix, scheme and `/v1/`/`/v2/` stripped, most specific first, Docker
Hub credentials as a fallback; pod secrets before node credentials; the node's files
searched in upstream's order."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from klet.cri.types import AuthConfig
from klet.syncloop.containers.keyring import (
    Keyring,
    KeyringError,
    docker_config_paths,
    node_docker_config,
    parse_config_json,
    parse_dockercfg,
    parse_image,
    pull_credentials,
    secret_docker_config,
    urls_match,
    with_default_tag,
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def creds(user: str) -> AuthConfig:
    return AuthConfig(username=user, password=f"{user}-pw")


@pytest.mark.parametrize(
    ("image", "repository", "tag", "digest"),
    [
        ("busybox", "docker.io/library/busybox", "", ""),
        ("busybox:1.36", "docker.io/library/busybox", "1.36", ""),
        ("team/app", "docker.io/team/app", "", ""),
        ("docker.io/busybox", "docker.io/library/busybox", "", ""),
        ("index.docker.io/team/app:v1", "docker.io/team/app", "v1", ""),
        ("registry.klet.test/busybox:1.36", "registry.klet.test/busybox", "1.36", ""),
        ("127.0.0.1:5000/a/b:c", "127.0.0.1:5000/a/b", "c", ""),
        ("localhost/app", "localhost/app", "", ""),
        ("quay.io/x/y@sha256:" + "a" * 64, "quay.io/x/y", "", "sha256:" + "a" * 64),
    ],
)
def test_parse_image(image: str, repository: str, tag: str, digest: str) -> None:
    parsed = parse_image(image)
    assert (parsed.repository, parsed.tag, parsed.digest) == (repository, tag, digest)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("team/App", "invalid reference format: repository name (team/App) must be lowercase"),
        ("bad image", "invalid reference format"),
        ("x:", "invalid reference format"),
        ("a" * 64, f"invalid repository name ({'a' * 64}), cannot specify 64-byte"),
    ],
)
def test_invalid_image_names(image: str, message: str) -> None:
    with pytest.raises(KeyringError) as err:
        parse_image(image)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("image", "tagged"),
    [
        ("busybox", "busybox:latest"),
        ("reg.io:5000/app", "reg.io:5000/app:latest"),
        ("busybox:1.36", "busybox:1.36"),
        ("busybox@sha256:" + "b" * 64, "busybox@sha256:" + "b" * 64),
    ],
)
def test_default_tag(image: str, tagged: str) -> None:
    assert with_default_tag(image) == tagged


def test_default_tag_of_an_invalid_name_says_which() -> None:
    with pytest.raises(KeyringError, match='couldn\'t parse image name "Bad/x:": '):
        with_default_tag("Bad/x:")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"username": "u", "password": "p"}, AuthConfig(username="u", password="p")),
        ({"auth": b64("u:p:with:colons")}, AuthConfig(username="u", password="p:with:colons")),
        ({"auth": b64("u:pw").rstrip("=")}, AuthConfig(username="u", password="pw")),
        (
            {"Username": "U", "Password": "P", "email": "e@x"},
            AuthConfig(username="U", password="P"),
        ),
        ({"auth": b64("a:b"), "username": "ignored"}, AuthConfig(username="a", password="b")),
    ],
)
def test_entries(entry: dict[str, str], expected: AuthConfig) -> None:
    assert parse_dockercfg(json.dumps({"reg.io": entry})) == {"reg.io": expected}
    assert parse_config_json(json.dumps({"auths": {"reg.io": entry}})) == {"reg.io": expected}


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        "[]",
        json.dumps({"reg.io": {"auth": b64("no-colon")}}),
        json.dumps({"reg.io": {"auth": "!!!"}}),
        json.dumps({"reg.io": "string"}),
    ],
)
def test_malformed_dockercfg(data: str) -> None:
    with pytest.raises(KeyringError):
        parse_dockercfg(data)


def test_config_json_without_auths_is_empty() -> None:
    assert parse_config_json('{"credsStore": "desktop"}') == {}


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        (
            {
                "type": "kubernetes.io/dockerconfigjson",
                "data": {
                    ".dockerconfigjson": b64('{"auths": {"r.io": {"auth": "' + b64("u:p") + '"}}}')
                },
            },
            {"r.io": AuthConfig(username="u", password="p")},
        ),
        (
            {
                "type": "kubernetes.io/dockercfg",
                "data": {".dockercfg": b64('{"r.io": {"username": "u", "password": "p"}}')},
            },
            {"r.io": AuthConfig(username="u", password="p")},
        ),
        ({"type": "Opaque", "data": {".dockercfg": b64("{}")}}, None),
        ({"type": "kubernetes.io/dockerconfigjson", "data": {".dockercfg": b64("{}")}}, None),
        ({"type": "kubernetes.io/dockercfg"}, None),
    ],
)
def test_secret_docker_config(secret: dict, expected: dict | None) -> None:  # type: ignore[type-arg]
    assert secret_docker_config(secret) == expected


@pytest.mark.parametrize(
    ("glob", "target", "matches"),
    [
        ("reg.io", "reg.io/app", True),
        ("reg.io", "other.io/app", False),
        ("reg.io:5000", "reg.io:5000/app", True),
        ("reg.io:5000", "reg.io/app", False),
        ("reg.io", "reg.io:5000/app", False),
        ("127.0.0.1:5000", "127.0.0.1:5000/private/app", True),
        ("*.reg.io", "eu.reg.io/app", True),
        ("*.reg.io", "reg.io/app", False),
        ("*.reg.io", "a.b.reg.io/app", False),
        ("*.*.reg.io", "a.b.reg.io/app", True),
        ("reg.*", "reg.io/app", True),
        ("r?g.io", "reg.io/app", False),  # as upstream: "?" starts the URL's query
        ("reg.io/team", "reg.io/team/app", True),
        ("reg.io/team", "reg.io/other/app", False),
        ("reg.io/team", "reg.io/teammate/app", True),  # a string prefix, as upstream
        ("reg.io/team/app", "reg.io/team", False),
    ],
)
def test_urls_match(glob: str, target: str, matches: bool) -> None:
    assert urls_match(glob, target) is matches


@pytest.mark.parametrize(
    ("config", "repository", "users"),
    [
        # schemes and /v1/ /v2/ are stripped from the locations
        ({"https://reg.io/v1/": "a"}, "reg.io/app", ["a"]),
        ({"http://reg.io": "a"}, "reg.io/app", ["a"]),
        ({"reg.io/v2/team": "a"}, "reg.io/team/app", ["a"]),
        # the most specific location first
        ({"quay.io": "host", "quay.io/coreos": "path"}, "quay.io/coreos/etcd", ["path", "host"]),
        ({"*.quay.io": "glob", "eu.quay.io": "exact"}, "eu.quay.io/x", ["exact", "glob"]),
        # Docker Hub: docker.io matches directly; index.docker.io is the fallback
        ({"docker.io": "hub"}, "docker.io/library/busybox", ["hub"]),
        ({"https://index.docker.io/v1/": "legacy"}, "docker.io/library/busybox", ["legacy"]),
        ({"index.docker.io": "legacy", "reg.io": "r"}, "reg.io/app", ["r"]),
        ({"index.docker.io": "legacy"}, "reg.io/app", []),
        ({"docker.io": "hub", "index.docker.io": "legacy"}, "docker.io/team/x", ["hub"]),
        ({}, "reg.io/app", []),
    ],
)
def test_lookup(config: dict[str, str], repository: str, users: list[str]) -> None:
    keyring = Keyring([{loc: creds(user) for loc, user in config.items()}])
    assert [c.username for c in keyring.lookup(repository)] == users


def test_locations_that_normalise_alike_keep_every_credential() -> None:
    keyring = Keyring([{"reg.io": creds("a")}, {"https://reg.io": creds("b")}])
    assert [c.username for c in keyring.lookup("reg.io/app")] == ["a", "b"]


def test_pod_secrets_come_before_node_credentials() -> None:
    found = pull_credentials(
        "reg.io/team/app:1",
        secrets=[{"reg.io": creds("secret1")}, {"reg.io/team": creds("secret2")}],
        node={"reg.io/team/app": creds("node")},
    )
    assert [c.username for c in found] == ["secret2", "secret1", "node"]


def test_no_matching_credentials_means_anonymous() -> None:
    assert pull_credentials("busybox", secrets=[{"reg.io": creds("x")}], node={}) == []


def test_node_config_search_order(tmp_path: Path) -> None:
    root, cwd, home = tmp_path / "root", tmp_path / "cwd", tmp_path / "home"
    json_paths, cfg_paths = docker_config_paths(root, cwd=cwd, home=home)
    assert json_paths == (
        root / "config.json",
        cwd / "config.json",
        home / ".docker" / "config.json",
        Path("/.docker/config.json"),
    )
    assert cfg_paths == (
        root / ".dockercfg",
        cwd / ".dockercfg",
        home / ".dockercfg",
        Path("/.dockercfg"),
    )


@pytest.mark.parametrize(
    ("files", "user"),
    [
        # the first config.json that parses wins, over any .dockercfg
        ({"home/.docker/config.json": "home", "root/.dockercfg": "cfg"}, "home"),
        ({"root/config.json": "root", "cwd/config.json": "cwd"}, "root"),
        ({"root/config.json": None, "cwd/config.json": "cwd"}, "cwd"),  # None: malformed
        # no config.json: the first .dockercfg
        ({"home/.dockercfg": "home", "cwd/.dockercfg": "cwd"}, "cwd"),
        ({}, None),
    ],
)
def test_node_docker_config(tmp_path: Path, files: dict[str, str | None], user: str | None) -> None:
    contents: dict[Path, bytes] = {}
    for rel, who in files.items():
        entry = {"reg.io": {"username": who, "password": "p"}}
        if who is None:
            data = b"{broken"
        elif rel.endswith("config.json"):
            data = json.dumps({"auths": entry}).encode()
        else:
            data = json.dumps(entry).encode()
        contents[tmp_path / rel] = data
    paths = docker_config_paths(tmp_path / "root", cwd=tmp_path / "cwd", home=tmp_path / "home")
    config = node_docker_config(paths, contents.get)
    assert (config["reg.io"].username if config else None) == user

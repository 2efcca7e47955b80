"""--image-credential-provider-config and -bin-dir (klet.config.credentialproviders).

Covers: a valid file (YAML or JSON) gives its providers with durations, args and env; a
directory's *.json/*.yaml/*.yml files merge in lexical order and a name used twice is
refused; every upstream validation (kind, apiVersion of the file and of each provider,
name characters, matchImages present and parseable, defaultCacheDuration present and
not negative, unknown fields) is reported at once, naming the file and the field;
tokenAttributes (a field of the v1 file only) is read into TokenAttributes and checked
as upstream (audience, requireServiceAccount and cacheType required, the provider
speaking credentialprovider v1, annotation keys qualified, unique, not both required
and optional, required keys only with requireServiceAccount true); the bin dir and
each provider's executable must exist; the configuration's hash is
upstream's (sha256 over each file's length and bytes); through load_settings either
flag without the other is refused, and a good pair lands in KletSettings.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from klet.config import ConfigError, load_settings
from klet.config.credentialproviders import (
    CredentialProviderConfig,
    TokenAttributes,
    describe,
    load_credential_providers,
)

V1 = "credentialprovider.kubelet.k8s.io/v1"

GOOD_YAML = """\
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-credential-provider
    matchImages: ["*.dkr.ecr.*.amazonaws.com", "registry.io:5000/team"]
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env:
      - name: AWS_PROFILE
        value: node
"""


def _bin(tmp_path: Path, *names: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return bin_dir


def test_a_valid_file(tmp_path: Path) -> None:
    config = tmp_path / "creds.yaml"
    config.write_text(GOOD_YAML)
    loaded, problems = load_credential_providers(config, _bin(tmp_path, "ecr-credential-provider"))
    assert problems == []
    assert loaded is not None
    (p,) = loaded.providers
    assert p.name == "ecr-credential-provider"
    assert p.match_images == ("*.dkr.ecr.*.amazonaws.com", "registry.io:5000/team")
    assert p.default_cache_duration == 12 * 3600
    assert p.api_version == V1
    assert p.args == ("get-credentials",)
    assert p.env == (("AWS_PROFILE", "node"),)


def test_a_directory_merges_in_lexical_order(tmp_path: Path) -> None:
    conf = tmp_path / "conf.d"
    conf.mkdir()

    def doc(name: str) -> str:
        return json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "CredentialProviderConfig",
                "providers": [
                    {
                        "name": name,
                        "matchImages": ["r.io"],
                        "defaultCacheDuration": "1m",
                        "apiVersion": "credentialprovider.kubelet.k8s.io/v1alpha1",
                    }
                ],
            }
        )

    (conf / "20-b.json").write_text(doc("b"))
    (conf / "10-a.json").write_text(doc("a"))
    (conf / "README").write_text("not a config")
    bin_dir = _bin(tmp_path, "a", "b")
    loaded, problems = load_credential_providers(conf, bin_dir)
    assert problems == [] and loaded is not None
    assert [p.name for p in loaded.providers] == ["a", "b"]
    contents = [(conf / f).read_bytes() for f in ("10-a.json", "20-b.json")]
    expected = hashlib.sha256(b"".join(len(c).to_bytes(8, "big") + c for c in contents))
    assert loaded.hash == f"sha256:{expected.hexdigest()}"
    (conf / "30-c.json").write_text(doc("a"))
    _, problems = load_credential_providers(conf, bin_dir)
    assert [str(p) for p in problems] == [
        f'{conf / "30-c.json"}: providers[0].name: duplicate provider name "a" '
        f"(also in {conf / '10-a.json'})"
    ]


def test_every_problem_at_once_naming_file_and_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        """\
apiVersion: kubelet.config.k8s.io/v2
kind: CredentialProviderConfig
extra: 1
providers:
  - name: "a/b"
    apiVersion: credentialprovider.kubelet.k8s.io/v9
    defaultCacheDuration: -1s
    matchImages: ["bad host:port"]
    tokenAttributes:
      serviceAccountTokenAudience: aud
  - name: c
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    unknownField: x
    env: NAME=value
"""
    )
    _, problems = load_credential_providers(config, _bin(tmp_path, "c"))
    text = [str(p) for p in problems]
    f = str(config)
    assert f"{f}: apiVersion: " in text[0] and "kubelet.config.k8s.io/v2" in text[0]
    expected = [
        f"{f}: extra: unknown field",
        f'{f}: providers[0].name: "a/b": may not contain "/" or spaces, nor be . or ..',
        f"{f}: providers[0].matchImages[0]: "
        '"bad host:port": match image is invalid: it may not contain spaces or control '
        "characters",
        f"{f}: providers[0].defaultCacheDuration: must be greater than or equal to 0",
        f"{f}: providers[1].unknownField: unknown field",
        f"{f}: providers[1].matchImages: at least 1 item in matchImages is required",
        f"{f}: providers[1].defaultCacheDuration: required",
        f"{f}: providers[1].env: must be a list of name and value objects",
    ]
    for line in expected:
        assert line in text, line
    assert any(t.startswith(f"{f}: providers[0].apiVersion: Unsupported value") for t in text)
    # kubelet.config.k8s.io/v2 is no version that has tokenAttributes
    assert f"{f}: providers[0].tokenAttributes: unknown field" in text
    # a/b has no executable to look for (bad name); nothing else is reported about it
    assert len(text) == len(expected) + 3


TOKEN_YAML = """\
apiVersion: {version}
kind: CredentialProviderConfig
providers:
  - name: p
    matchImages: ["r.io"]
    defaultCacheDuration: 1m
    apiVersion: {plugin}
    tokenAttributes: {attrs}
"""


def _token_problems(
    tmp_path: Path,
    attrs: str,
    *,
    version: str = "kubelet.config.k8s.io/v1",
    plugin: str = V1,
) -> tuple[object, list[str]]:
    config = tmp_path / "tokens.yaml"
    config.write_text(TOKEN_YAML.format(version=version, plugin=plugin, attrs=attrs))
    loaded, problems = load_credential_providers(config, _bin(tmp_path, "p"))
    return loaded, [str(p).removeprefix(f"{config}: providers[0].") for p in problems]


def test_token_attributes_read(tmp_path: Path) -> None:
    loaded, problems = _token_problems(
        tmp_path,
        "{serviceAccountTokenAudience: registry.example, cacheType: ServiceAccount, "
        "requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [example.com/role], "
        "optionalServiceAccountAnnotationKeys: [tier]}",
    )
    assert problems == []
    assert isinstance(loaded, CredentialProviderConfig)
    assert loaded.providers[0].token_attributes == TokenAttributes(
        audience="registry.example",
        cache_type="ServiceAccount",
        require_service_account=True,
        required_annotation_keys=("example.com/role",),
        optional_annotation_keys=("tier",),
    )
    assert "with service account tokens for registry.example" in describe(loaded.providers)


def test_token_attributes_only_in_v1(tmp_path: Path) -> None:
    attrs = "{serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: false}"
    for version in ("kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1alpha1"):
        _, problems = _token_problems(tmp_path, attrs, version=version)
        assert problems == ["tokenAttributes: unknown field"], version
    _, problems = _token_problems(
        tmp_path, attrs, plugin="credentialprovider.kubelet.k8s.io/v1beta1"
    )
    assert problems == [
        "tokenAttributes: tokenAttributes is only supported for "
        "credentialprovider.kubelet.k8s.io/v1 API version"
    ]


def test_token_attributes_checked_as_upstream(tmp_path: Path) -> None:
    _, problems = _token_problems(tmp_path, "{odd: 1}")
    assert problems == [
        "tokenAttributes.odd: unknown field",
        "tokenAttributes.serviceAccountTokenAudience: required",
        "tokenAttributes.requireServiceAccount: required",
        "tokenAttributes.cacheType: cacheType is required to be set when tokenAttributes is "
        "specified. Supported values are: ServiceAccount, Token",
    ]
    _, problems = _token_problems(
        tmp_path,
        "{serviceAccountTokenAudience: a, cacheType: Pod, requireServiceAccount: false, "
        "requiredServiceAccountAnnotationKeys: [a/b/c, ok, ok], "
        "optionalServiceAccountAnnotationKeys: [ok, -bad]}",
    )
    assert problems == [
        "tokenAttributes.requiredServiceAccountAnnotationKeys: requireServiceAccount cannot be "
        "false when requiredServiceAccountAnnotationKeys is set",
        'tokenAttributes.requiredServiceAccountAnnotationKeys: "a/b/c": prefix part must be a '
        "lowercase RFC 1123 subdomain",
        'tokenAttributes.requiredServiceAccountAnnotationKeys: "ok": duplicate value',
        'tokenAttributes.optionalServiceAccountAnnotationKeys: "-bad": name part must be at '
        "most 63 characters of alphanumerics, '-', '_' or '.', starting and ending with an "
        "alphanumeric character",
        "tokenAttributes: ['ok']: annotation keys cannot be both required and optional",
        "tokenAttributes.cacheType: Unsupported value: 'Pod': supported \"ServiceAccount\", "
        '"Token"',
    ]
    # upstream lowercases a key before checking it: an upper-case key is accepted
    _, problems = _token_problems(
        tmp_path,
        "{serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: true, "
        "optionalServiceAccountAnnotationKeys: [Example.COM/Role]}",
    )
    assert problems == []


def test_bin_dir_and_executables_must_exist(tmp_path: Path) -> None:
    config = tmp_path / "creds.yaml"
    config.write_text(GOOD_YAML)
    _, problems = load_credential_providers(config, tmp_path / "absent")
    assert [str(p) for p in problems] == [
        f"--image-credential-provider-bin-dir: plugin binary directory {tmp_path / 'absent'} "
        "did not exist"
    ]
    bin_dir = _bin(tmp_path)
    (bin_dir / "ecr-credential-provider").write_text("not executable")
    _, problems = load_credential_providers(config, bin_dir)
    assert [str(p) for p in problems] == [
        f"{config}: providers[0].name: plugin binary executable "
        f"{bin_dir / 'ecr-credential-provider'} did not exist (or is not executable)"
    ]
    _, problems = load_credential_providers(tmp_path / "nope.yaml", bin_dir)
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'nope.yaml'}: unable to access path: no such file or directory"
    ]


def test_unparseable_and_empty_files(tmp_path: Path) -> None:
    bin_dir = _bin(tmp_path)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    _, problems = load_credential_providers(broken, bin_dir)
    assert str(problems[0]).startswith(f"{broken}: cannot read: ")
    empty = tmp_path / "empty.yaml"
    empty.write_text(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n"
    )
    _, problems = load_credential_providers(empty, bin_dir)
    assert [str(p) for p in problems] == [
        f"{empty}: providers: at least 1 item in plugins is required"
    ]


def test_flags_through_load_settings(tmp_path: Path) -> None:
    config = tmp_path / "creds.yaml"
    config.write_text(GOOD_YAML)
    bin_dir = _bin(tmp_path, "ecr-credential-provider")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KLET_")}
    settings = load_settings(
        [
            f"--image-credential-provider-config={config}",
            "--image-credential-provider-bin-dir",
            str(bin_dir),
        ],
        env=env,
        service="syncloop",
        hostname="node-a",
    )
    loaded = settings.klet.credential_providers
    assert loaded is not None and loaded.bin_dir == bin_dir
    assert [p.name for p in loaded.providers] == ["ecr-credential-provider"]
    assert (
        load_settings([], env=env, service="syncloop", hostname="n").klet.credential_providers
        is None
    )
    with pytest.raises(ConfigError) as info:
        load_settings(
            [f"--image-credential-provider-config={config}"],
            env=env,
            service="syncloop",
            hostname="n",
        )
    assert info.value.problems == [
        "--image-credential-provider-config: needs --image-credential-provider-bin-dir "
        "(where the plugins are)"
    ]
    with pytest.raises(ConfigError) as info:
        load_settings(
            [f"--image-credential-provider-bin-dir={bin_dir}"],
            env=env,
            service="syncloop",
            hostname="n",
        )
    assert info.value.problems == [
        "--image-credential-provider-bin-dir: needs --image-credential-provider-config "
        "(the plugins to run)"
    ]

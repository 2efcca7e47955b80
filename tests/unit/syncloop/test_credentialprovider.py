"""The credential provider protocol's pure parts (containers/credentialprovider.py).

Covers matchImages globs (host parts, ports, path prefixes, as upstream's URLsMatchStr),
the request a plugin gets (the repository, never a tag), strict decoding of responses
(apiVersion must be the provider's, kind, cacheKeyType, unknown fields, credentials
never quoted in errors), where an answer is cached by cacheKeyType, its expiry from
cacheDuration or the provider's default (0 = not cached), and the cache's lookup order
(image, registry, global) with expired entries dropped. Service account tokens
(tokenAttributes): the request carries the token and annotations only when there are
some; the annotations passed are the required ones (one missing refuses) and the
optional ones present; the service account's cache key has its namespace, name, UID and
annotations, and the token's hash only for cacheType Token; an answer echoing the token
as a password is recognised; cached answers are kept apart per service account.
"""

from __future__ import annotations

import json

import pytest
from klet.cri.types import AuthConfig
from klet.syncloop.containers import credentialprovider as cp

V1 = "credentialprovider.kubelet.k8s.io/v1"


@pytest.mark.parametrize(
    ("patterns", "repository", "allowed"),
    [
        (["*.dkr.ecr.*.amazonaws.com"], "123.dkr.ecr.us-east-1.amazonaws.com/app", True),
        (["*.dkr.ecr.*.amazonaws.com"], "dkr.ecr.us-east-1.amazonaws.com/app", False),
        (["*.azurecr.io"], "team.azurecr.io/x/y", True),
        (["gcr.io"], "gcr.io/project/app", True),
        (["gcr.io"], "eu.gcr.io/project/app", False),
        (["*.gcr.io", "gcr.io"], "eu.gcr.io/project/app", True),
        (["registry.io:8080/path"], "registry.io:8080/path/app", True),
        (["registry.io:8080/path"], "registry.io:8080/other/app", False),
        (["registry.io:8080"], "registry.io/app", False),
        (["registry.io"], "registry.io:8080/app", False),
        (["127.0.0.1:5000"], "127.0.0.1:5000/secure/app", True),
        (["docker.io"], "docker.io/library/busybox", True),
        ([], "anything.io/app", False),
    ],
)
def test_match_images(patterns: list[str], repository: str, allowed: bool) -> None:
    assert cp.image_allowed(patterns, repository) is allowed


def test_request_names_the_repository_in_the_providers_version() -> None:
    body = json.loads(cp.encode_request(V1, "registry.io/app"))
    assert body == {
        "apiVersion": V1,
        "kind": "CredentialProviderRequest",
        "image": "registry.io/app",
    }


def _response(**fields: object) -> bytes:
    base: dict[str, object] = {
        "apiVersion": V1,
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Registry",
        "auth": {"registry.io": {"username": "u", "password": "secret-pw"}},
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


def test_decode_response() -> None:
    r = cp.decode_response(_response(cacheDuration="5m"), V1)
    assert r.cache_key_type == "Registry"
    assert r.cache_duration == 300.0
    assert r.auth == {"registry.io": AuthConfig(username="u", password="secret-pw")}
    assert cp.decode_response(_response(auth=None), V1).auth == {}
    assert cp.decode_response(_response(), V1).cache_duration is None


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"not json", "error decoding credential provider plugin response from stdout"),
        (
            _response(apiVersion="credentialprovider.kubelet.k8s.io/v1beta1"),
            "did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual "
            "apiVersion:credentialprovider.kubelet.k8s.io/v1beta1",
        ),
        (_response(kind="Other"), "unexpected Kind: 'Other'"),
        (_response(cacheKeyType="Node"), "did not return a valid cacheKeyType: 'Node'"),
        (_response(cacheKeyType=None), "did not return a valid cacheKeyType: None"),
        (_response(extra=1), "unknown field in CredentialProviderResponse: extra"),
        (_response(cacheDuration="5"), "cacheDuration: invalid duration"),
        (
            _response(auth={"r.io": {"username": "u", "password": "secret-pw", "x": 1}}),
            "auth['r.io'] must hold only username and password",
        ),
    ],
)
def test_bad_responses_are_refused_without_quoting_credentials(data: bytes, error: str) -> None:
    with pytest.raises(cp.ResponseError) as info:
        cp.decode_response(data, V1)
    assert error in str(info.value)
    assert "secret-pw" not in str(info.value)


def test_cache_keys_by_type() -> None:
    repo = "registry.io:5000/team/app"
    assert cp.cache_key("Image", repo) == repo
    assert cp.cache_key("Registry", repo) == "registry.io:5000"
    assert cp.cache_key("Global", repo) == cp.GLOBAL_CACHE_KEY
    assert cp.registry("docker.io/library/busybox") == "docker.io"


def test_expiry_from_the_response_or_the_default() -> None:
    resp = cp.PluginResponse("Image", None, {})
    assert cp.expires_at(resp, 60.0, 1000.0) == 1060.0
    assert cp.expires_at(resp, 0.0, 1000.0) is None  # default 0: not cached
    assert cp.expires_at(cp.PluginResponse("Image", 10.0, {}), 60.0, 1000.0) == 1010.0
    assert cp.expires_at(cp.PluginResponse("Image", 0.0, {}), 60.0, 1000.0) is None


def test_cache_lookup_order_and_expiry() -> None:
    cache = cp.CredentialCache()
    a, b, c = (AuthConfig(username=n, password="p") for n in "abc")
    cache.put(cp.GLOBAL_CACHE_KEY, {"*": c}, expiry=2000.0)
    cache.put("registry.io", {"registry.io": b}, expiry=1500.0)
    cache.put("registry.io/app", {"registry.io/app": a}, expiry=1100.0)
    assert cache.get("registry.io/app", 1000.0) == {"registry.io/app": a}
    assert cache.get("registry.io/other", 1000.0) == {"registry.io": b}
    assert cache.get("elsewhere.io/app", 1000.0) == {"*": c}
    # the image's entry expired: dropped on lookup, the registry's answers
    assert cache.get("registry.io/app", 1200.0) == {"registry.io": b}
    assert len(cache) == 2
    cache.purge(1600.0)
    assert len(cache) == 1
    assert cache.get("registry.io/app", 2001.0) is None
    assert len(cache) == 0


def test_request_with_a_service_account_token() -> None:
    data = cp.encode_request(
        V1, "r.io/app", token="eyJ.a.b", annotations={"example.com/role": "puller"}
    )
    assert json.loads(data) == {
        "apiVersion": V1,
        "kind": "CredentialProviderRequest",
        "image": "r.io/app",
        "serviceAccountToken": "eyJ.a.b",
        "serviceAccountAnnotations": {"example.com/role": "puller"},
    }
    assert set(json.loads(cp.encode_request(V1, "r.io/app", token="", annotations={}))) == {
        "apiVersion",
        "kind",
        "image",
    }


def test_service_account_annotations_required_and_optional() -> None:
    on_sa = {"example.com/role": "puller", "tier": "gold", "other": "x"}
    chosen = cp.service_account_annotations(
        on_sa, required=["example.com/role"], optional=["tier", "absent"]
    )
    assert chosen == {"example.com/role": "puller", "tier": "gold"}
    with pytest.raises(cp.RequiredAnnotationMissing, match="required annotation gone not found"):
        cp.service_account_annotations(on_sa, required=["gone"], optional=[])


def test_service_account_cache_key() -> None:
    def key(cache_type: str, token: str, uid: str = "u1", role: str = "a") -> str:
        return cp.service_account_cache_key(
            namespace="ns",
            name="sa",
            uid=uid,
            annotations={"role": role},
            cache_type=cache_type,
            token=token,
        )

    # ServiceAccount: one key for every token of the account
    assert key("ServiceAccount", "t1") == key("ServiceAccount", "t2")
    # Token: a new token is a new key
    assert key("Token", "t1") != key("Token", "t2")
    assert "t1" not in key("Token", "t1")  # the hash, never the token
    # a re-created account (new UID) or changed annotations are new keys
    assert key("ServiceAccount", "t1", uid="u2") != key("ServiceAccount", "t1")
    assert key("ServiceAccount", "t1", role="b") != key("ServiceAccount", "t1")


def test_echoed_token() -> None:
    answer = cp.PluginResponse("Image", None, {"r.io": AuthConfig(username="x", password="tok")})
    assert cp.echoes_token(answer, "tok")
    assert not cp.echoes_token(answer, "other")
    assert not cp.echoes_token(answer, "")


def test_cache_is_kept_per_service_account() -> None:
    cache = cp.CredentialCache()
    creds = {"r.io": AuthConfig(username="a", password="b")}
    cache.put("r.io", creds, 200.0, "sa-one")
    assert cache.get("r.io/app", 100.0, "sa-one") == creds
    assert cache.get("r.io/app", 100.0, "sa-two") is None
    assert cache.get("r.io/app", 100.0) is None

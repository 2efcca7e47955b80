"""PluginProvider and PluginKeyring (containers/credentialplugins.py) over a scripted plugin.

Covers: a provider is not run for an image its matchImages do not cover; an answer is
reused until it expires, by its cacheKeyType (Image: that repository only, Registry:
every image of the host, Global: every image), with the provider's default duration
when the response has none and no caching at 0; concurrent pulls of one image share one
run; a failing plugin gives no credentials and is run again next time; the keyring puts
every provider's answer together, most specific pattern first. With tokenAttributes:
the plugin gets the pod's service account token (asked for that account, bound to the
pod, with the audience and the account's UID) and the chosen annotations; answers are
cached per service account (cacheType ServiceAccount: once per account; Token: once per
token); no plugin run for a pod without a service account when one is required, for an
account missing a required annotation, an absent account, a refused token or no
apiserver at all; a pod without a service account runs the plugin without a token when
none is required; an answer echoing the token is refused unless cacheType is Token.
The exec itself (a real
process, its env, args and timeout) is tests/integration/test_credential_plugins.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from klet.config.credentialproviders import CredentialProvider, TokenAttributes
from klet.cri.types import AuthConfig
from klet.syncloop.containers import credentialprovider as cp
from klet.syncloop.containers.credentialplugins import (
    AccountSource,
    PluginFailed,
    PluginKeyring,
    PluginProvider,
    PullingPod,
)
from klet.syncloop.environment.kubeobjects import ObjectUnavailable
from klet.syncloop.volumes.tokens import TokenError

V1 = "credentialprovider.kubelet.k8s.io/v1"
CRED = AuthConfig(username="robot", password="pw")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Plugin:
    """Answers every request the same way, counting requests; `fail` makes runs fail;
    `gate` holds runs until set."""

    def __init__(self, key_type: str = "Image", duration: float | None = None) -> None:
        self.key_type = key_type
        self.duration = duration
        self.requests: list[str] = []
        self.tokens: list[tuple[str, dict[str, str]]] = []
        self.fail = False
        self.gate: asyncio.Event | None = None
        self.password = "pw"

    async def __call__(
        self, repository: str, token: str = "", annotations: Mapping[str, str] | None = None
    ) -> cp.PluginResponse:
        self.requests.append(repository)
        self.tokens.append((token, dict(annotations or {})))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise PluginFailed("exit status 1: no credentials today")
        cred = AuthConfig(username="robot", password=self.password)
        return cp.PluginResponse(self.key_type, self.duration, {"*.registry.io": cred})


def provider(
    default: float = 60.0, patterns: tuple[str, ...] = ("*.registry.io",)
) -> CredentialProvider:
    return CredentialProvider(
        name="robot", match_images=patterns, default_cache_duration=default, api_version=V1
    )


async def test_unmatched_images_never_run_the_plugin() -> None:
    plugin = Plugin()
    p = PluginProvider(provider(), plugin)
    assert await p.provide("docker.io/library/busybox") == {}
    assert plugin.requests == []


async def test_image_key_answers_only_that_repository_until_it_expires() -> None:
    clock, plugin = Clock(), Plugin("Image")
    p = PluginProvider(provider(default=60.0), plugin, clock=clock)
    assert await p.provide("a.registry.io/app") == {"*.registry.io": CRED}
    assert await p.provide("a.registry.io/app") == {"*.registry.io": CRED}
    assert await p.provide("a.registry.io/other") == {"*.registry.io": CRED}
    assert plugin.requests == ["a.registry.io/app", "a.registry.io/other"]
    clock.t += 61
    await p.provide("a.registry.io/app")
    assert plugin.requests[-1] == "a.registry.io/app" and len(plugin.requests) == 3


async def test_registry_and_global_keys_cover_more_images() -> None:
    plugin = Plugin("Registry")
    p = PluginProvider(provider(), plugin, clock=Clock())
    await p.provide("a.registry.io/app")
    await p.provide("a.registry.io/other")
    await p.provide("b.registry.io/app")
    assert plugin.requests == ["a.registry.io/app", "b.registry.io/app"]
    plugin = Plugin("Global")
    p = PluginProvider(provider(), plugin, clock=Clock())
    await p.provide("a.registry.io/app")
    await p.provide("b.registry.io/app")
    assert plugin.requests == ["a.registry.io/app"]


async def test_response_duration_wins_and_zero_is_not_cached() -> None:
    clock, plugin = Clock(), Plugin("Global", duration=5.0)
    p = PluginProvider(provider(default=600.0), plugin, clock=clock)
    await p.provide("a.registry.io/app")
    clock.t += 6
    await p.provide("a.registry.io/app")
    assert len(plugin.requests) == 2
    plugin = Plugin("Global", duration=None)
    p = PluginProvider(provider(default=0.0), plugin, clock=clock)
    await p.provide("a.registry.io/app")
    await p.provide("a.registry.io/app")
    assert len(plugin.requests) == 2


async def test_concurrent_pulls_of_one_image_share_one_run() -> None:
    plugin = Plugin("Image", duration=0.0)
    plugin.gate = asyncio.Event()
    p = PluginProvider(provider(), plugin, clock=Clock())
    waiters = [asyncio.create_task(p.provide("a.registry.io/app")) for _ in range(3)]
    await asyncio.sleep(0)
    plugin.gate.set()
    results = await asyncio.gather(*waiters)
    assert results == [{"*.registry.io": CRED}] * 3
    assert plugin.requests == ["a.registry.io/app"]


async def test_a_failing_plugin_gives_nothing_and_runs_again_next_time() -> None:
    plugin = Plugin("Global")
    plugin.fail = True
    p = PluginProvider(provider(), plugin, clock=Clock())
    assert await p.provide("a.registry.io/app") == {}
    plugin.fail = False
    assert await p.provide("a.registry.io/app") == {"*.registry.io": CRED}
    assert len(plugin.requests) == 2


async def test_keyring_merges_providers_most_specific_first() -> None:
    specific = AuthConfig(username="team", password="t")

    async def team(
        repository: str, token: str = "", annotations: Mapping[str, str] | None = None
    ) -> cp.PluginResponse:
        return cp.PluginResponse("Image", None, {"a.registry.io/team": specific})

    keyring = PluginKeyring(
        [
            PluginProvider(provider(), Plugin("Global"), clock=Clock()),
            PluginProvider(provider(patterns=("a.registry.io",)), team, clock=Clock()),
        ]
    )
    assert await keyring.lookup("a.registry.io/team/app") == [specific, CRED]
    assert await keyring.lookup("a.registry.io/solo") == [CRED]
    assert await keyring.lookup("elsewhere.io/app") == []


class Accounts:
    """ServiceAccounts by (namespace, name); `down` makes reads fail."""

    def __init__(self, **accounts: dict[str, Any]) -> None:
        self.accounts = accounts
        self.down = False

    async def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.down:
            raise ObjectUnavailable("connection refused")
        return self.accounts.get(name)


class Tokens:
    """Issues token-<n>, recording each request; `refuse` makes requests fail."""

    def __init__(self) -> None:
        self.asked: list[tuple[dict[str, Any], str, str, str]] = []
        self.refuse = False
        self.serial = 0

    async def token(
        self,
        pod: dict[str, Any],
        *,
        service_account: str,
        audience: str,
        expiration_s: int,
        service_account_uid: str = "",
    ) -> tuple[str, float]:
        self.asked.append((pod, service_account, audience, service_account_uid))
        if self.refuse:
            raise TokenError("failed to fetch token: forbidden")
        return f"token-{self.serial}", 0.0


def account(uid: str, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "sa", "uid": uid, "annotations": annotations}}


def token_provider(
    cache_type: str = "ServiceAccount",
    *,
    require: bool = True,
    required: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
) -> CredentialProvider:
    attrs = TokenAttributes(
        audience="registry.example",
        cache_type=cache_type,
        require_service_account=require,
        required_annotation_keys=required,
        optional_annotation_keys=optional,
    )
    return replace(provider(), token_attributes=attrs)


POD = PullingPod(namespace="ns", name="web", uid="pod-uid", service_account="sa")


async def test_the_plugin_gets_the_pods_bound_token_and_annotations() -> None:
    plugin, tokens = Plugin("Registry"), Tokens()
    accounts = Accounts(sa=account("sa-uid", role="puller", tier="gold", other="x"))
    p = PluginProvider(
        token_provider(required=("role",), optional=("tier", "absent")),
        plugin,
        clock=Clock(),
        source=AccountSource(accounts, tokens),
    )
    assert await p.provide("a.registry.io/app", POD) == {"*.registry.io": CRED}
    assert plugin.tokens == [("token-0", {"role": "puller", "tier": "gold"})]
    ((bound, sa, audience, uid),) = tokens.asked
    assert bound["metadata"] == {"namespace": "ns", "name": "web", "uid": "pod-uid"}
    assert (sa, audience, uid) == ("sa", "registry.example", "sa-uid")
    # the keyring reads the pod's own fields
    pod = {"metadata": {"namespace": "ns", "name": "web", "uid": "u"}, "spec": {}}
    assert PullingPod.of(pod).service_account == ""
    pod["spec"] = {"serviceAccountName": "sa"}
    assert PullingPod.of(pod) == PullingPod("ns", "web", "u", "sa")


async def test_cached_per_service_account_or_per_token() -> None:
    tokens = Tokens()
    accounts = Accounts(sa=account("one"), other=account("two"))
    plugin = Plugin("Registry")
    p = PluginProvider(
        token_provider("ServiceAccount"),
        plugin,
        clock=Clock(),
        source=AccountSource(accounts, tokens),
    )
    await p.provide("a.registry.io/app", POD)
    tokens.serial += 1  # a refreshed token: still the same account
    await p.provide("a.registry.io/other", POD)
    assert len(plugin.requests) == 1
    await p.provide("a.registry.io/app", replace(POD, service_account="other"))
    assert len(plugin.requests) == 2  # another account: its own entry
    plugin = Plugin("Registry")
    p = PluginProvider(
        token_provider("Token"), plugin, clock=Clock(), source=AccountSource(accounts, Tokens())
    )
    await p.provide("a.registry.io/app", POD)
    await p.provide("a.registry.io/app", POD)
    assert len(plugin.requests) == 1
    p.source.tokens.serial += 1  # type: ignore[union-attr]
    await p.provide("a.registry.io/app", POD)
    assert [t for t, _ in plugin.tokens] == ["token-0", "token-1"]


async def test_no_run_without_a_usable_service_account() -> None:
    plugin, tokens = Plugin("Image", duration=0.0), Tokens()
    accounts = Accounts(sa=account("u", role="x"))
    source = AccountSource(accounts, tokens)
    no_sa = replace(POD, service_account="")
    # required, and the pod has none
    assert (
        await PluginProvider(token_provider(), plugin, source=source).provide(
            "a.registry.io/a", no_sa
        )
        == {}
    )
    # a required annotation missing
    p = PluginProvider(token_provider(required=("gone",)), plugin, source=source)
    assert await p.provide("a.registry.io/a", POD) == {}
    # the account absent, unreadable; the token refused; no apiserver at all
    p = PluginProvider(token_provider(), plugin, source=source)
    assert await p.provide("a.registry.io/a", replace(POD, service_account="absent")) == {}
    accounts.down = True
    assert await p.provide("a.registry.io/a", POD) == {}
    accounts.down, tokens.refuse = False, True
    assert await p.provide("a.registry.io/a", POD) == {}
    standalone = PluginProvider(token_provider(), plugin, source=AccountSource())
    assert await standalone.provide("a.registry.io/a", POD) == {}
    assert plugin.requests == []
    # not required: a pod without a service account runs the plugin without a token
    p = PluginProvider(token_provider(require=False), plugin, source=source)
    assert await p.provide("a.registry.io/a", no_sa) == {"*.registry.io": CRED}
    assert plugin.tokens == [("", {})]


async def test_an_echoed_token_is_refused_unless_cached_per_token() -> None:
    accounts = Accounts(sa=account("u"))
    plugin = Plugin("Image")
    plugin.password = "token-0"
    p = PluginProvider(
        token_provider("ServiceAccount"),
        plugin,
        clock=Clock(),
        source=AccountSource(accounts, Tokens()),
    )
    assert await p.provide("a.registry.io/a", POD) == {}
    assert len(p.cache) == 0
    p = PluginProvider(
        token_provider("Token"), plugin, clock=Clock(), source=AccountSource(accounts, Tokens())
    )
    (auth,) = (await p.provide("a.registry.io/a", POD)).values()
    assert auth.password == "token-0"


async def test_keyring_passes_the_pod() -> None:
    plugin = Plugin("Image")
    keyring = PluginKeyring(
        [
            PluginProvider(
                token_provider(),
                plugin,
                clock=Clock(),
                source=AccountSource(Accounts(sa=account("u")), Tokens()),
            )
        ]
    )
    pod = {
        "metadata": {"namespace": "ns", "name": "web", "uid": "u"},
        "spec": {"serviceAccountName": "sa"},
    }
    assert await keyring.lookup("a.registry.io/app", pod) == [CRED]
    assert plugin.tokens == [("token-0", {})]

"""PluginProvider and PluginKeyring (containers/credentialplugins.py) over a scripted plugin.

Covers: a provider is not run for an image its matchImages do not cover; an answer is
reused until it expires, by its cacheKeyType (Image: that repository only, Registry:
every image of the host, Global: every image), with the provider's default duration
when the response has none and no caching at 0; concurrent pulls of one image share one
run; a failing plugin gives no credentials and is run again next time; the keyring puts
every provider's answer together, most specific pattern first. The exec itself (a real
process, its env, args and timeout) is tests/integration/test_credential_plugins.py's.
"""

from __future__ import annotations

import asyncio

from klet.config.credentialproviders import CredentialProvider
from klet.cri.types import AuthConfig
from klet.syncloop.containers import credentialprovider as cp
from klet.syncloop.containers.credentialplugins import PluginFailed, PluginKeyring, PluginProvider

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
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def __call__(self, repository: str) -> cp.PluginResponse:
        self.requests.append(repository)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise PluginFailed("exit status 1: no credentials today")
        return cp.PluginResponse(self.key_type, self.duration, {"*.registry.io": CRED})


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

    async def team(repository: str) -> cp.PluginResponse:
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

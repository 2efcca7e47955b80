"""tools/config_fields.py counts a KubeletConfiguration field as read only where code loads
its value from an expression holding the configuration (a typed name, a configuration-typed
attribute, a name assigned from one), never because a method or attribute elsewhere has
the same name, and a parameter holds it only by its annotation; feature gates are read by
literal or constant name. Each case is a small source tree of its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.config_fields import Program, sources


def reads_of(tmp_path: Path, *modules: str) -> tuple[set[str], set[str]]:
    base = tmp_path / "services" / "demo" / "src" / "klet" / "demo"
    base.mkdir(parents=True)
    (tmp_path / "libs" / "src").mkdir(parents=True)
    for i, text in enumerate(modules):
        (base / f"m{i}.py").write_text(textwrap.dedent(text))
    found = Program(sources(tmp_path)).walk()
    return found.fields, found.gates


SETTINGS = """
    from klet.config.kubelet import KubeletConfiguration

    class Settings:
        kubelet: KubeletConfiguration
"""


def test_a_method_named_like_a_field_reads_nothing(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        """
        class Loop:
            async def run_once(self) -> None: ...

            async def run(self) -> None:
                await self.run_once()
                self.fail_swap_on = True
        """,
    )
    assert fields == set()


def test_the_same_name_on_another_object_reads_nothing(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        SETTINGS,
        """
        def f(settings, options) -> int:
            k = settings.kubelet
            return options.oom_score_adj + k.max_pods
        """,
    )
    assert fields == {"maxPods"}


def test_an_untyped_parameter_holds_nothing_whatever_callers_pass(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        SETTINGS,
        """
        def check(cfg: object) -> bool:
            return bool(getattr(cfg, "run_once", False))

        def main(settings) -> bool:
            return check(settings.kubelet)
        """,
    )
    assert fields == set()


@pytest.mark.parametrize(
    "body",
    [
        # a parameter annotated with the configuration's class
        """
        from klet.config import KubeletConfiguration
        def f(cfg: KubeletConfiguration) -> bool:
            return cfg.run_once
        """,
        # the configuration-typed attribute of any object, and a name assigned from it
        """
        def f(deps) -> bool:
            return deps.settings.kubelet.run_once
        """,
        """
        def f(settings) -> bool:
            k, klet = settings.kubelet, settings.klet
            return k.run_once
        """,
        # getattr with a literal
        """
        def f(settings) -> bool:
            return getattr(settings.kubelet, "run_once")
        """,
        # an inner function sees the enclosing function's names
        """
        def f(settings):
            k = settings.kubelet
            def inner() -> bool:
                return k.run_once
            return inner
        """,
    ],
)
def test_reads_through_configuration_expressions(tmp_path: Path, body: str) -> None:
    fields, _ = reads_of(tmp_path, SETTINGS, body)
    assert fields == {"runOnce"}


def test_a_protocol_of_configuration_fields_is_the_configuration(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        """
        from typing import Protocol

        class SwapConfig(Protocol):
            @property
            def fail_swap_on(self) -> bool: ...

        class Other(Protocol):
            @property
            def fail_swap_on(self) -> bool: ...
            @property
            def not_a_field(self) -> int: ...

        def check(cfg: SwapConfig, other: Other) -> bool:
            return cfg.fail_swap_on and other.not_a_field > 0

        def unrelated(other: Other) -> bool:
            return other.fail_swap_on
        """,
    )
    assert fields == {"failSwapOn"}


def test_nested_blocks_and_properties(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        SETTINGS,
        """
        def f(settings) -> object:
            auth = settings.kubelet.authentication
            settings.kubelet.effective_image_service_endpoint
            return auth.webhook.cache_ttl, settings.kubelet.tracing
        """,
    )
    assert fields == {
        "authentication.webhook.cacheTTL",
        "imageServiceEndpoint",
        "containerRuntimeEndpoint",
        "tracing",
    }


def test_a_block_read_but_not_its_leaves_reads_no_leaf(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        SETTINGS,
        """
        def f(settings) -> object:
            return settings.kubelet.logging
        """,
    )
    assert fields == set()


def test_a_configuration_returned_by_a_function(tmp_path: Path) -> None:
    fields, _ = reads_of(
        tmp_path,
        """
        from klet.config.kubelet import KubeletConfiguration

        def load() -> tuple[KubeletConfiguration, list[str]]: ...

        def f() -> int:
            cfg, problems = load()
            fresh = KubeletConfiguration()
            return cfg.max_pods + fresh.port
        """,
    )
    assert fields == {"maxPods", "port"}


def test_feature_gates_by_literal_or_constant(tmp_path: Path) -> None:
    _, gates = reads_of(
        tmp_path,
        SETTINGS,
        """
        GATE = "EventedPLEG"

        def f(settings, other) -> bool:
            k = settings.kubelet
            other.feature_gates.get("NotRead", True)
            enabled(other.feature_gates, "NotReadEither")
            return (
                k.feature_gates.get(GATE, True)
                and k.feature_gates["MemoryQoS"]
                and enabled(settings.kubelet.feature_gates, "SystemdWatchdog")
                and gates.enabled(k.feature_gates, "KubeletPSI")
            )
        """,
    )
    assert gates == {"EventedPLEG", "MemoryQoS", "SystemdWatchdog", "KubeletPSI"}

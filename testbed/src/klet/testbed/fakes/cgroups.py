"""A stateful fake of systemd's slice operations (klet.cgroups.systemd.Systemd) for unit
tests: units by name with their properties, a call log, and an error to raise next.

Like systemd it refuses to start a unit that exists (the caller then sets properties),
forgets a unit when it is stopped, and knows nothing of a unit it never started. It
serves unit tests only; the systemd tier (tests/systemd) runs the real one.
"""

from __future__ import annotations

from klet.cgroups.slices import Property


class FakeSystemd:
    def __init__(self) -> None:
        self.units: dict[str, dict[str, object]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_next: Exception | None = None

    def _enter(self, op: str, unit: str) -> None:
        self.calls.append((op, unit))
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err

    async def ensure_slice(
        self, unit: str, properties: list[Property], limits: list[Property]
    ) -> bool:
        self._enter("ensure", unit)
        if unit in self.units:
            self.units[unit].update({name: value for name, _sig, value in limits})
            return True
        # As systemd does, a slice's parents (its name up to each dash) are loaded with
        # it: plain units, not transient, when nobody started them before.
        stem = unit.removesuffix(".slice").split("-")
        for i in range(1, len(stem)):
            self.units.setdefault("-".join(stem[:i]) + ".slice", {"Transient": False})
        self.units[unit] = {name: value for name, _sig, value in properties}
        self.units[unit]["Transient"] = True
        return False

    async def stop_slice(self, unit: str) -> None:
        self._enter("stop", unit)
        self.units.pop(unit, None)

    async def unit_active_state(self, unit: str) -> str:
        self._enter("state", unit)
        return "active" if unit in self.units else ""

    def restart(self) -> None:
        """systemd restarted: transient units are gone."""
        self.units.clear()

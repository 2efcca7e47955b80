"""Which modules a fresh interpreter holds after some imports: the unit tests that pin
"this start-up path does not load X" (a memory cut: the D-Bus client, the certificate
machinery, the CRI stubs) ask a new process, since the test process has everything
loaded already."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence


def loaded_after(setup: str, modules: Sequence[str]) -> list[str]:
    """Run `setup` (Python statements, e.g. ``"import klet.cli.up"``) in a fresh
    interpreter and return those of `modules` it then holds, in the order given."""
    code = (
        f"import json, sys\n{setup}\n"
        f"print(json.dumps([m for m in {list(modules)!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(out.stdout.splitlines()[-1]))

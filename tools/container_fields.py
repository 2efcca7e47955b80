"""List every field of a Pod's container, from the Kubernetes API model, and which ones
klet ignores.

The paths come from the official Python client's models (`V1Container` and the types
it nests), so a newer API with a new field shows up here without anyone remembering
it; `klet.syncloop.fields` says which ones klet implements and which it ignores (and
why), and a unit test fails when a model field is in neither. Run it to print the
ignored ones: `.venv/bin/python tools/container_fields.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import kubernetes.client as k8s


def _model(type_name: str) -> type | None:
    inner = re.sub(r"^(list\[|dict\(str, )", "", type_name).rstrip("])")
    model = getattr(k8s, inner, None)
    return model if isinstance(model, type) and hasattr(model, "attribute_map") else None


def leaf_paths(model: type = k8s.V1Container, prefix: str = "") -> Iterator[str]:
    """Dotted JSON paths of every scalar (or free-form) field under `model`."""
    for attr, json_name in model.attribute_map.items():  # type: ignore[attr-defined]
        path = f"{prefix}{json_name}"
        nested = _model(model.openapi_types[attr])  # type: ignore[attr-defined]
        if nested is None:
            yield path
        else:
            yield from leaf_paths(nested, f"{path}.")


def main() -> None:
    from klet.syncloop.fields import IGNORED, classify

    for path in leaf_paths():
        rule = classify(path)
        if rule in IGNORED:
            print(f"{path}\t{IGNORED[rule]}")


if __name__ == "__main__":
    main()

"""List every field of a Pod's spec and containers and every volume type, from the
Kubernetes API model, and which ones klet ignores.

The paths come from the official Python client's models (`V1Container` and the types
it nests), so a newer API with a new field shows up here without anyone remembering
it; `klet.syncloop.containers.fields` says which ones klet implements and which it ignores (and
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


def pod_paths() -> Iterator[str]:
    """The pod spec's fields, not descending into containers and volumes."""
    skip = ("containers.", "initContainers.", "ephemeralContainers.", "volumes.")
    for path in leaf_paths(k8s.V1PodSpec):
        if not path.startswith(skip):
            yield path
    yield from ("containers", "initContainers", "ephemeralContainers", "volumes")


def volume_types() -> list[str]:
    """The volume sources of the API (every field of a Volume but its name)."""
    return sorted(set(k8s.V1Volume.attribute_map.values()) - {"name"})


def main() -> None:
    from klet.syncloop.containers import fields

    print("# container fields klet ignores")
    for path in leaf_paths():
        rule = fields.classify(path)
        if rule in fields.IGNORED:
            print(f"{path}\t{fields.IGNORED[rule]}")
    print("# pod spec fields klet ignores")
    rules = {fields.classify_pod(p) for p in pod_paths()}
    for rule in sorted(r for r in rules if r in fields.POD_IGNORED):
        print(f"{rule}\t{fields.POD_IGNORED[rule]}")
    print("# fields that get a pod rejected at admission (PodFeatureUnsupported)")
    container_rules = {fields.classify(p) for p in leaf_paths()}
    for refused in sorted(r for r in fields.REFUSED if r in container_rules):
        print(f"containers[].{refused}\t{fields.REFUSED[refused]}")
    for rule in sorted(r for r in rules if r in fields.POD_REFUSED):
        print(f"{rule}\t{fields.POD_REFUSED[rule]}")
    print("# volume types klet does not set up (FailedMount: unsupported)")
    print(" ".join(t for t in volume_types() if t not in fields.VOLUME_TYPES))


if __name__ == "__main__":
    main()

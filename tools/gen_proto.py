"""Generate the Python gRPC stubs of proto/ into libs/src/klet/rpc/gen with grpcio-tools.

Run by `make proto` (and `make setup`). The output is not committed and not edited by
hand; imports are rewritten from `klet.podcontrol.v1` to `klet.rpc.gen.klet.podcontrol.v1`
so the generated package lives inside klet.rpc. The well-known types that
grpcio-tools ships (google/protobuf/*.proto) are on the include path; their Python
modules come from the protobuf runtime, not from here.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
OUT = ROOT / "libs" / "src" / "klet" / "rpc" / "gen"
WELL_KNOWN = Path(grpc_tools.__file__).parent / "_proto"


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    protos = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO}",
        f"-I{WELL_KNOWN}",
        f"--python_out={OUT}",
        f"--pyi_out={OUT}",
        f"--grpc_python_out={OUT}",
        *protos,
    ]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    for path in OUT.rglob("*.py*"):
        text = path.read_text()
        fixed = re.sub(r"^from klet\.", "from klet.rpc.gen.klet.", text, flags=re.M)
        path.write_text(fixed)
    for directory in [OUT, *[d for d in OUT.rglob("*") if d.is_dir()]]:
        (directory / "__init__.py").touch()
    print(f"generated {len(protos)} proto file(s) into {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the committed Python stubs from proto/ (run after editing a .proto).

    python proto/generate.py            # writes client/modelinit/v1/*_pb2*.py
    python proto/generate.py OUT_DIR    # writes OUT_DIR/modelinit/v1/... (the stub test uses this)

The stubs are committed so the client installs without grpcio-tools; tests/test_proto_stubs.py
regenerates them with the pinned grpcio-tools and fails if they differ from the committed ones.
"""
import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent
PROTOS = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("modelinit/v1/*.proto"))


def generate(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", *PROTOS]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "client")

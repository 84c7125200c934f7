"""Regenerate the committed Python stubs from proto/ (run after editing a .proto).

    python proto/generate.py            # writes proto/modelinit_wire/v1/*_pb2*.py(i)
    python proto/generate.py OUT_DIR    # writes OUT_DIR/modelinit_wire/v1/... (the stub test uses this)

The stubs are committed so the client installs without grpcio-tools; tests/wire/test_proto_stubs.py
regenerates them with the pinned grpcio-tools and fails if they differ from the committed ones.

They live in the shared wire package ``modelinit_wire.v1`` while the proto keeps its path,
``modelinit/v1/modelinit.proto`` (what other languages' code generators and reflection see).
protoc names Python modules after the proto's path and has no option to change that, so two
strings of its output are rewritten to the package's name: the stubs' import of the messages
and the module name the messages are registered under.
"""
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent
PROTOS = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("modelinit/v1/*.proto"))
#: (protoc's text, the wire package's), each of which must occur in the file it is rewritten in.
RENAMES = {
    "modelinit_pb2.py": ("'modelinit.v1.modelinit_pb2'", "'modelinit_wire.v1.modelinit_pb2'"),
    "modelinit_pb2_grpc.py": ("from modelinit.v1 import modelinit_pb2", "from modelinit_wire.v1 import modelinit_pb2"),
}


def generate(out: pathlib.Path) -> None:
    dest = out / "modelinit_wire" / "v1"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *PROTOS]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        for made in sorted((pathlib.Path(tmp) / "modelinit" / "v1").glob("*_pb2*")):
            text = made.read_text()
            if made.name in RENAMES:
                old, new = RENAMES[made.name]
                if old not in text:
                    raise SystemExit(f"{made.name}: protoc's output no longer holds {old}; update RENAMES")
                text = text.replace(old, new)
            (dest / made.name).write_text(text)


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)

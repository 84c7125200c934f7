"""Writes the seed corpus of every target into fuzz/corpus/TARGET: valid inputs of each kind, so the
campaign starts from deep paths, not from parsing errors. ``python -m fuzz.seeds`` rewrites the
``seed-*`` files (``regression-*`` files, the inputs of fixed findings, are kept as they are)."""
from __future__ import annotations

import json
import struct

from fuzz.run import CORPUS

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 16,
         "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32,
         "max_position_embeddings": 32}
BERT = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}
POLICY = {"preset": "hf-default", "rules": [
    {"name": "residual", "match": {"roles": ["attn_out", "mlp_out"], "params": ["weight"]}, "init": {"normal": {"std": 0.02}},
     "depth_scaling": "n_layers"},
    {"name": "tf-style", "match": {"kinds": ["linear"], "params": ["weight"], "min_layer": 0, "max_layer": 1},
     "init": {"trunc_normal": {"std": 0.02, "a": -2, "b": 2, "bounds": "sigma", "preserve_std": False}}},
    {"match": {"kinds": ["embedding"]}, "init": "lecun_normal", "zero_padding_row": True},
    {"match": {"names": ["*.bias"]}, "init": {"uniform": {"low": -0.1, "high": 0.1}}},
    {"match": {"kinds": ["norm"]}, "init": {"kaiming_normal": {"mode": "fan_in", "nonlinearity": "relu"}}}]}
POLICY_YAML = """preset: hf-default
rules:
  - name: residual
    match: {roles: [attn_out, mlp_out], params: [weight]}
    init: {normal: {std: 0.02}}
    depth_scaling: n_layers
  - &r
    match: {kinds: [norm]}
    init: ones
  - *r
"""


def _requests() -> dict[str, bytes]:
    from modelinit_wire import policy_file
    from modelinit_wire.v1 import modelinit_pb2 as pb

    llama = pb.ModelSpec(config_json=json.dumps(LLAMA))
    policy = policy_file.from_dict(POLICY)
    out = {
        "plan-preset": b"\x00" + pb.PlanRequest(request=pb.ModelRequest(spec=pb.ModelSpec(preset="gpt2"), seed=1),
                                                page_size=10).SerializeToString(),
        "plan-config-policy": b"\x00" + pb.PlanRequest(request=pb.ModelRequest(
            spec=llama, policy=policy, seed=7, dtype="bfloat16", max_shard_size="10KB")).SerializeToString(),
        "init-files-offset": b"\x01" + pb.InitRequest(request=pb.ModelRequest(spec=llama, seed=2, max_shard_size="8KB"),
                                                      files=[1, 0], offset=100, chunk_size=4096).SerializeToString(),
        "init-bert": b"\x01" + pb.InitRequest(request=pb.ModelRequest(
            spec=pb.ModelSpec(config_json=json.dumps(BERT), architecture="BertForMaskedLM"),
            policy=pb.Policy(preset="bert-tf"))).SerializeToString(),
    }
    tensors = pb.TensorsRequest(request=pb.ModelRequest(spec=llama, seed=3), chunk_size=1024, start=1, offset=4, selections=[
        pb.TensorSelection(name="model.embed_tokens.weight", dims=[pb.SliceDim(start=1, stop=9), pb.SliceDim(start=0)]),
        pb.TensorSelection(name="model.norm.weight")])
    out["tensors-slices"] = b"\x02" + tensors.SerializeToString()
    return out


def _shard() -> bytes:
    header = {"__metadata__": {"format": "pt", "modelinit_fingerprint": "cf21203f29fa1151"},
              "a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b.bias": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(24)


def seeds() -> dict[str, dict[str, bytes]]:
    index = {"metadata": {"total_size": 28}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                            "b.weight": "model-00001-of-00002.safetensors",
                                                            "c.weight": "model-00002-of-00002.safetensors"}}
    manifest = {"format": "modelinit", "algorithm_version": 2, "fingerprint": "cf21203f29fa1151",
                "request": {"spec": {"config": LLAMA}, "policy": POLICY, "seed": 3, "dtype": "float32",
                            "max_shard_size": "5GB"},
                "files": [{"name": "model.safetensors", "size": 1024, "sha256": "0" * 64},
                          {"name": "config.json", "size": 20, "sha256": "1" * 64}],
                "total_params": 200, "total_bytes": 800}
    record = {"fingerprint": "cf21203f29fa1151", "algorithm_version": 2, "stale": ["old.safetensors"],
              "files": [{"name": "model.safetensors", "size": 1024, "sha256": "0" * 64}], "part": [1, 4],
              "e_tags": {"model.safetensors": "\"abc\""}}
    return {
        "request": _requests(),
        "config": {"llama": b"\x00" + json.dumps(LLAMA).encode(), "bert": b"\x03" + json.dumps(BERT).encode(),
                   "preset-like": b"\x00" + json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2,
                                                        "vocab_size": 32}).encode()},
        "policy_file": {"json": b"\x00" + json.dumps(POLICY).encode(), "yaml": b"\x01" + POLICY_YAML.encode()},
        "arguments": {"size": b"\x00" + b"1.5GiB", "size-plain": b"\x00" + b"4096", "part": b"\x01" + b"3/16",
                      "slices": b"\x02" + b'[[0, 8], null, {"start": 2}]',
                      "numbers": b"\x03" + struct.pack("<QQ", (1 << 63) + 65536, (1 << 63) + 100)},
        "token": {"value": b"\x00" + b"s3cr3t-token_value", "file": b"\x01" + b"s3cr3t-token\n"},
        "spec_argument": {"config": b"\x00" + json.dumps(LLAMA).encode(), "folder": b"\x01", "loop": b"\x02"},
        "safetensors_header": {"shard": _shard()},
        "index": {"index": b"\x00\x03" + json.dumps(index).encode()},
        "manifest": {"manifest": json.dumps(manifest).encode(), "record": json.dumps(record).encode()},
        # folder: (changes - 1), then per change: the file, the operation and its arguments (fuzz.targets.files._damage)
        "folder": {"overwrite-header": bytes([0, 0, 0, 8, 0, 4]) + b"\xff\xff\xff\xff",
                   "cut-index": bytes([0, 9, 1, 8, 0]) + b"{}" * 4,
                   "shard-folder": bytes([1, 2, 2, 11, 3]),
                   "manifest-fifo": bytes([0, 10, 5])},
    }


#: Inputs of findings, fixed, kept as regressions (each names its fix in fuzz/README.md).
def _header_of(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(4)


REGRESSIONS: dict[str, dict[str, bytes]] = {
    # a dtype that is a list: TypeError (unhashable) in file_checks.check_header, out of verify
    "safetensors_header": {"dtype-list": _header_of({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}})},
    # a config 100,000 layers deep: transformers constructs every layer (about 10 ms each), so planning it ran for
    # a quarter of an hour; the first campaign's timeouts were BART at 226 layers on a loaded machine
    "config": {"depth-100000": b"\x01" + b'{"model_type": "bart", "num_hidden_layers": 100000}'},
    # a NUL in the token file's path: open's ValueError escaped load_token without naming the field
    "token": {"nul-in-path": b"\x02tok\x00en"},
    # a name longer than the filesystem takes: Path.exists() raised OSError (ENAMETOOLONG) out of read_spec_argument
    "spec_argument": {"name-too-long": b"\x03" + b"\xff" * 300,
                      # and one ending in .json, taken as a file: Path.is_dir() raised the same
                      "json-name-too-long": b"\x03" + b"\xff" * 195 + b".json"},
    # finalize over a folder whose progress record nests 3,000 deep: a RecursionError escaped
    # (destinations.prefix.recorded_request), shown as "input nested too deeply" without a file.
    "folder": {"progress-record-bomb": bytes([0, 11, 1]) + struct.pack("<H", 6011) + b'{"part": ' + b"[" * 3000
               + b"]" * 3000},
}


def main() -> None:
    for target, files in seeds().items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for name, data in files.items():
            (folder / f"seed-{name}").write_bytes(data)
    for target, files in REGRESSIONS.items():
        for name, data in files.items():
            (CORPUS / target / f"regression-{name}").write_bytes(data)


if __name__ == "__main__":
    main()

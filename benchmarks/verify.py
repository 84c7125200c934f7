"""``modelinit verify --no-regenerate`` of a checkpoint: its files read on the usable cores at once,
against one file at a time.

    python benchmarks/verify.py                      # about 2 files of 1 GB each (bfloat16)
    python benchmarks/verify.py --files 4 --size-gb 0.5 --repeat 5
    python benchmarks/verify.py --smoke --repeat 1   # a tiny model: that the script runs (tests/project/test_benchmarks.py)

Writes a checkpoint of about ``--files`` shards once (``modelinit init``, embedded), reads it once to warm
the page cache (what is timed is hashing and checking, not the disk), then times
``verify_folder(regenerate=False)`` with the usable cores (``modelinit_host.usable_cores``) and
with one reader, in turn, best of ``--repeat``. A measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
for path in (ROOT / "server", ROOT / "client", ROOT / "proto"):
    sys.path.insert(0, str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--size-gb", type=float, default=1.0, help="each file's size")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny Llama in files of about 100 KB instead (that the script runs; its figures mean nothing)")
    args = ap.parse_args()

    import modelinit
    from modelinit import verify
    from modelinit_host.usable_cores import usable_cores

    # A Llama of about files x size-gb in bfloat16: 262 MB of embeddings, 134 MB per layer.
    layers = max(1, int((args.files * args.size_gb * 0.95e9 - 0.262e9) / 0.134e9))  # a margin: shards split at tensors
    spec = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000,
            "tie_word_embeddings": False}
    if args.smoke:
        spec |= {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "vocab_size": 1000}
        args.size_gb = 1e-4
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        out = pathlib.Path(tmp) / "ckpt"
        with modelinit.Client() as c:
            c.init_model(spec, seed=0, out_dir=out, dtype="bfloat16", max_shard_size=f"{int(args.size_gb * 1e9)}B")
        shards = sorted(out.glob("*.safetensors"))
        total = sum(f.stat().st_size for f in shards)
        for f in shards:
            f.read_bytes()  # into the page cache
        cores = usable_cores()

        def timed(readers: int) -> float:
            verify.usable_cores = lambda: readers
            t = time.perf_counter()
            report = verify.verify_folder(out, regenerate=False)
            elapsed = time.perf_counter() - t
            if not report.ok:
                raise SystemExit(f"verify failed: {report.problems}")
            return elapsed

        best = {1: float("inf"), cores: float("inf")}
        for _ in range(args.repeat):
            for readers in best:
                best[readers] = min(best[readers], timed(readers))
    print(f"verify --no-regenerate, {len(shards)} files, {total / 1e9:.2f} GB in all, page cache warm, "
          f"{cores} usable cores, best of {args.repeat}")
    for readers, seconds in best.items():
        print(f"  {readers} reader(s)  {seconds:7.3f} s  {total / seconds / 1e9:6.2f} GB/s")
    print(f"  speed-up  {best[1] / best[cores]:.2f}x")


if __name__ == "__main__":
    main()

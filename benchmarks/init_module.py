"""In the training process: ``modelinit.init_module_`` next to transformers' own initialization.

    python benchmarks/init_module.py                       # TinyLlama-1.1B shape, bf16, CPU
    python benchmarks/init_module.py --layers 4 --dtype float32

Builds the model on the meta device, materializes it with ``to_empty`` (what a sharded training
job does), then times, on the same module: ``init_module_(model, seed=0)`` (hf-default, the bytes
``modelinit init`` writes) and transformers' ``model.initialize_weights()`` (its ``_init_weights`` on
every module, the marks of what is initialized cleared first; torch's global RNG). DESIGN.md §9's goal: init_module_ faster on CPU. Only one
process here; the per-rank scaling of sharded runs (each rank ~1/N of the time) is left to a
later script. A measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "server"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client"))

TINYLLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=TINYLLAMA["num_hidden_layers"])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs each")
    args = ap.parse_args()

    import torch
    import transformers

    from modelinit_server.training import init_module_

    doc = dict(TINYLLAMA, num_hidden_layers=args.layers)
    config = transformers.AutoConfig.for_model(doc.pop("model_type"), **doc)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    model.to_empty(device="cpu")
    n = sum(p.numel() for p in model.parameters())
    print(f"LlamaForCausalLM, {args.layers} layers, {n / 1e9:.2f} B params, {args.dtype}, "
          f"{torch.get_num_threads()} torch threads")

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    init_module_(model, seed=0)  # warm: numba compile/cache load, spec resolution
    ours = best(lambda: init_module_(model, seed=0))
    def transformers_init() -> None:
        # transformers 5 skips what it marks initialized: clear the marks, then run its init
        for obj in (*model.modules(), *model.parameters(), *model.buffers()):
            if getattr(obj, "_is_hf_initialized", False):
                obj._is_hf_initialized = False
        model.initialize_weights()

    before = model.lm_head.weight[:4, :4].clone()
    theirs = best(transformers_init)
    if torch.equal(before, model.lm_head.weight[:4, :4]):
        print("warning: transformers' init left lm_head unchanged; its time is not a real init")
    print(f"init_module_            {ours:8.2f} s   {n / ours / 1e6:8.0f} M params/s")
    print(f"transformers init       {theirs:8.2f} s   {n / theirs / 1e6:8.0f} M params/s")
    print(f"ratio (theirs / ours)   {theirs / ours:8.2f}x")


if __name__ == "__main__":
    main()

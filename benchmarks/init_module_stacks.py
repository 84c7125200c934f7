"""``init_module_`` on a training stack's own model next to the stack's own initialization.

    python benchmarks/init_module_stacks.py                 # torchtitan Llama 3 1B, float32, CPU
    python benchmarks/init_module_stacks.py --flavor debugmodel --repeat 3

Builds torchtitan's Llama 3 model of ``--flavor`` on the meta device, materializes it with
``to_empty`` (what its trainer does), then times each on a freshly materialized model (the first
touch of its memory included, as in a training job), best of ``--repeat``:

* ``modelinit.init_module_(model, seed=0, spec=...)`` with the Hugging Face config the flavor
  corresponds to: the bytes ``modelinit init`` writes for it (after one warm call: numba's kernel
  load, the spec, the map read off torchtitan's hooks and adapter, timed apart as "first call");
* torchtitan's own ``model.init_states()`` (its parameters' ``param_init`` rules: truncated normals
  from torch's global RNG, and its buffers).

torchtitan must be importable (``tests/support/stacks.py`` installs it without its training stack
into ``tests/.stacks``; this script puts that folder on the path). torch and numba run at their
default thread counts. A measurement, not a test: nothing is asserted. Megatron-Core is not here
yet (docs/training.md, "Not yet").
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
for path in (ROOT / "tests" / ".stacks", ROOT / "server", ROOT / "client", ROOT / "proto"):
    sys.path.insert(0, str(path))

#: torchtitan's Llama 3 flavors as Hugging Face configs (the sizes torchtitan 0.3.0 builds).
FLAVORS = {
    "debugmodel": dict(model_type="llama", vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                       num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048, tie_word_embeddings=False),
    "1B": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, tie_word_embeddings=True),
}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flavor", default="1B", choices=sorted(FLAVORS))
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    import torch
    from torchtitan.models.llama3 import model_registry

    import modelinit

    hf = {**FLAVORS[args.flavor], "architectures": ["LlamaForCausalLM"]}

    def fresh():
        """A newly materialized model: its memory untouched, as after the trainer's to_empty."""
        with torch.device("meta"):
            model = model_registry(args.flavor, attn_backend="flex").model.build()
        return model.to_empty(device="cpu")

    def timed(fill) -> float:
        model = fresh()
        t = time.perf_counter()
        fill(model)
        return time.perf_counter() - t

    model = fresh()
    params = sum(p.numel() for p in model.parameters())
    t = time.perf_counter()
    modelinit.init_module_(model, seed=0, spec=hf)  # numba's kernel load, the spec, the map, then the fill
    first = time.perf_counter() - t
    del model
    ours = min(timed(lambda m: modelinit.init_module_(m, seed=0, spec=hf)) for _ in range(args.repeat))
    theirs = min(timed(lambda m: m.init_states(buffer_device=torch.device("cpu"))) for _ in range(args.repeat))
    print(f"torchtitan Llama 3 {args.flavor}: {params / 1e9:.2f} B parameters, float32, CPU "
          f"({os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads); each timed on a "
          "freshly materialized model (first touch of its memory included)")
    print(f"  init_module_, the process's first call (kernel load, spec, map)  {first:8.2f} s")
    print(f"  init_module_                                                     {ours:8.2f} s")
    print(f"  torchtitan init_states()                                         {theirs:8.2f} s")
    print(f"  ratio init_module_ / init_states                                 {ours / theirs:8.3f}")
    print(f"  ratio first call / init_states                                   {first / theirs:8.3f}")

if __name__ == "__main__":
    main()

"""``init_module_`` on a training stack's own model next to the stack's own initialization.

    python benchmarks/init_module_stacks.py                 # both stacks, Llama 3 1B, float32, CPU
    python benchmarks/init_module_stacks.py --stack megatron --flavor debugmodel --repeat 3

Builds torchtitan's Llama 3 model of ``--flavor`` on the meta device, materializes it with
``to_empty`` (what its trainer does), then times each on a freshly materialized model (the first
touch of its memory included, as in a training job), best of ``--repeat``:

* ``modelinit.init_module_(model, seed=0)``, no spec: the Hugging Face config the flavor
  corresponds to is derived from the model's own configuration (:func:`hf_config`), and the
  model gets the bytes ``modelinit init`` writes for it (after one warm call: numba's kernel
  load, the spec, the map read off torchtitan's hooks and adapter, timed apart as "first call");
* torchtitan's own ``model.init_states()`` (its parameters' ``param_init`` rules: truncated normals
  from torch's global RNG, and its buffers).

Megatron-Core's ``GPTModel`` of the same shape (the flavor's derived config; the local layer spec, a gloo group of one, TP=1,
PP=1) initializes inside its constructor: its own init is timed as the constructor with
``perform_initialization=True`` (its CPU init: ``use_cpu_initialization=True``, the init that is
the same at every TP size) less the constructor without it, each on fresh memory; ``init_module_``
fills the model built without it.

torchtitan must be importable (``tests/support/stacks.py`` installs it without its training stack
into ``tests/.stacks``; this script puts that folder on the path); megatron-core is in the test
extra. torch and numba run at their default thread counts. A measurement, not a test: nothing is
asserted.
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

#: torchtitan's Llama 3 flavors the script times (torchtitan.models.llama3's model_registry).
FLAVORS = ("debugmodel", "1B", "3B", "8B")


def hf_config(flavor: str) -> dict:
    """The Hugging Face config of torchtitan's Llama 3 ``flavor``, as ``init_module_`` derives it
    from the model's own configuration when no spec is given (``summary.derived_config``)."""
    import torch
    from torchtitan.models.llama3 import model_registry

    from modelinit_server.training.torchtitan_config import own_config

    with torch.device("meta"):
        return own_config(model_registry(flavor, attn_backend="flex").model.build())


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flavor", default="1B", choices=FLAVORS)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--stack", default="both", choices=("both", "torchtitan", "megatron"))
    args = ap.parse_args()
    if args.stack in ("both", "torchtitan"):
        torchtitan(args)
    if args.stack in ("both", "megatron"):
        megatron(args)


def torchtitan(args) -> None:
    import torch
    from torchtitan.models.llama3 import model_registry

    import modelinit

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
    modelinit.init_module_(model, seed=0)  # numba's kernel load, the derived spec, the map, then the fill
    first = time.perf_counter() - t
    del model
    ours = min(timed(lambda m: modelinit.init_module_(m, seed=0)) for _ in range(args.repeat))
    theirs = min(timed(lambda m: m.init_states(buffer_device=torch.device("cpu"))) for _ in range(args.repeat))
    print(f"torchtitan Llama 3 {args.flavor}: {params / 1e9:.2f} B parameters, float32, CPU "
          f"({os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads); each timed on a "
          "freshly materialized model (first touch of its memory included)")
    print(f"  init_module_, the process's first call (kernel load, spec, map)  {first:8.2f} s")
    print(f"  init_module_                                                     {ours:8.2f} s")
    print(f"  torchtitan init_states()                                         {theirs:8.2f} s")
    print(f"  ratio init_module_ / init_states                                 {ours / theirs:8.3f}")
    print(f"  ratio first call / init_states                                   {first / theirs:8.3f}")


def megatron_gpt(hf: dict, perform: bool, tp: int = 1):
    """Megatron-Core's ``GPTModel`` of the Hugging Face config ``hf``'s shape (the local layer spec,
    RMSNorm, SwiGLU, std 0.02), this rank's share of TP=``tp``, built on the CPU
    (``use_cpu_initialization``); ``perform``: with Megatron's own init (every rank draws each
    whole weight and keeps its slice). Megatron's parallel state is the caller's."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"], num_attention_heads=hf["num_attention_heads"],
        num_query_groups=hf["num_key_value_heads"], ffn_hidden_size=hf["intermediate_size"],
        tensor_model_parallel_size=tp, use_cpu_initialization=True, perform_initialization=perform,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
        add_bias_linear=False, init_method_std=0.02)
    return GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=hf["vocab_size"],
                    max_sequence_length=hf["max_position_embeddings"], position_embedding_type="rope",
                    share_embeddings_and_output_weights=hf["tie_word_embeddings"])


def megatron(args) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    import modelinit

    warnings.filterwarnings("ignore")  # Megatron warns that Apex and Transformer Engine are absent
    from megatron.core import parallel_state as ps

    hf = hf_config(args.flavor)  # the torchtitan flavor's shape
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel()

    def build(perform: bool):
        return megatron_gpt(hf, perform)

    def built(perform: bool) -> float:
        t = time.perf_counter()
        model = build(perform)
        elapsed = time.perf_counter() - t
        del model
        return elapsed

    model = build(False)
    params = sum(p.numel() for p in model.parameters())
    t = time.perf_counter()
    modelinit.init_module_(model, seed=0, spec=hf, policy="megatron")
    first = time.perf_counter() - t
    del model

    def ours_once() -> float:
        model = build(False)
        t = time.perf_counter()
        modelinit.init_module_(model, seed=0, spec=hf, policy="megatron")
        return time.perf_counter() - t

    ours = min(ours_once() for _ in range(args.repeat))
    bare = min(built(False) for _ in range(args.repeat))
    with_init = min(built(True) for _ in range(args.repeat))
    theirs = with_init - bare
    print(f"Megatron-Core GPTModel, Llama 3 {args.flavor} shape: {params / 1e9:.2f} B parameters, float32, CPU, TP=1 "
          f"({os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads)")
    print(f"  init_module_, the process's first call (kernel load, spec, map)  {first:8.2f} s")
    print(f"  init_module_ (policy megatron)                                   {ours:8.2f} s")
    print(f"  GPTModel(...) without init / with Megatron's CPU init            {bare:8.2f} s / {with_init:.2f} s")
    print(f"  Megatron's own CPU init (the difference)                         {theirs:8.2f} s")
    print(f"  ratio init_module_ / Megatron's init                             {ours / theirs:8.3f}")
    print(f"  ratio first call / Megatron's init                               {first / theirs:8.3f}")
    dist.destroy_process_group()

if __name__ == "__main__":
    main()

"""In the training process: ``modelinit.init_module_`` next to transformers' own initialization and
the plain PyTorch loop a user would hand-write.

    python benchmarks/init_module.py                       # TinyLlama-1.1B shape, bf16, CPU
    python benchmarks/init_module.py --layers 4 --dtype float32 --repeat 3
    python benchmarks/init_module.py --shape llama-3-8b --device cuda   # on a GPU: the Triton kernels
    python benchmarks/init_module.py --shape smoke --layers 1 --repeat 1  # does it run (no figure means much)

Builds the model on the meta device, materializes it with ``to_empty`` (what a sharded training
job does), then times, on the same module, best of ``--repeat`` each:

* ``init_module_(model, seed=0)``: hf-default, the bytes ``modelinit init`` writes (after one warm
  call: numba compile or cache load, spec resolution);
* transformers' ``model.initialize_weights()``: its ``_init_weights`` on every module, the marks of
  what is initialized cleared first; torch's global RNG;
* a plain PyTorch loop: ``normal_(0, 0.02)`` for linear and embedding weights, ones for norm
  weights, zeros for biases (the rules of hf-default, not its bytes; torch's global RNG);
* on the CPU, the kernel alone: the same elements of every parameter, normal, straight into its
  storage (issue 22's yardstick: init_module_ within 1.5x of it).

torch runs at its default thread count (all cores), numba too. The goal (docs/training.md,
"Benchmarks"): init_module_ faster on CPU. One process; the per-rank scaling of sharded runs is
``benchmarks/init_module_ranks.py``. A measurement, not a test: nothing is asserted.
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
LLAMA3_8B = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, tie_word_embeddings=False)
#: A Llama small enough that a run is its process start (tests/project/test_benchmarks.py's smoke run).
SMOKE = dict(model_type="llama", vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
SHAPES = {"tinyllama-1.1b": TINYLLAMA, "llama-3-8b": LLAMA3_8B, "smoke": SMOKE}


def torch_loop(model, std: float = 0.02) -> None:
    """The hand-written init: N(0, std) for linear and embedding weights, 1 for norm weights, 0 for
    biases. Every parameter is written (one that fits none of these raises)."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            for pname, p in module.named_parameters(recurse=False):
                if pname == "bias":
                    p.zero_()
                elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    p.normal_(0.0, std)
                elif "norm" in type(module).__name__.lower():
                    p.fill_(1.0)
                else:
                    raise ValueError(f"torch_loop: no rule for {type(module).__name__}.{pname}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES), help="the Llama's shape")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the module lives")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs each")
    args = ap.parse_args()

    import torch
    import transformers
    from modelinit_server.training import init_module_

    doc = dict(SHAPES[args.shape])
    if args.layers is not None:
        doc["num_hidden_layers"] = args.layers
    config = transformers.AutoConfig.for_model(doc.pop("model_type"), **doc)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    model.to_empty(device=args.device)
    n = sum(p.numel() for p in model.parameters())
    if args.device == "cpu":
        import numba

        where = f"CPU, {torch.get_num_threads()} torch threads, {numba.get_num_threads()} numba threads"
    else:
        where = torch.cuda.get_device_name()
    print(f"LlamaForCausalLM ({args.shape}), {doc['num_hidden_layers']} layers, {n / 1e9:.2f} B params, "
          f"{args.dtype}, {where}")

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return min(times)

    init_module_(model, seed=0)  # warm: numba compile/cache load, spec resolution
    ours = best(lambda: init_module_(model, seed=0))
    if args.device == "cuda":  # what it allocates beyond the parameters (issue 23: a few hundred MiB)
        sync()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        init_module_(model, seed=0)
        sync()
        print(f"init_module_ peak GPU memory beyond the parameters: "
              f"{(torch.cuda.max_memory_allocated() - held) / 2**20:.0f} MiB")

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
    torch_loop(model)  # warm
    loop = best(lambda: torch_loop(model))

    rows = [("init_module_", ours), ("transformers init", theirs), ("plain torch loop", loop)]
    kernel = best(lambda: kernel_alone(model, args.device)) if args.device == "cpu" else None
    if kernel is not None:
        rows.append(("kernel alone", kernel))
    for label, s in rows:
        print(f"{label:24s}{s:8.2f} s   {n / s / 1e6:8.0f} M params/s")
    print(f"{'transformers / ours':24s}{theirs / ours:8.2f}x   (goal >= 3x)")
    print(f"{'torch loop / ours':24s}{loop / ours:8.2f}x")
    if kernel is not None:
        print(f"{'ours / kernel alone':24s}{ours / kernel:8.2f}x   (goal <= 1.5x)")


def kernel_alone(model, device: str) -> None:
    """The CPU kernel generating the same number of elements of each parameter (normal, the
    parameter's dtype) straight into its storage: what init_module_ costs without its planning,
    matching and slicing."""
    from modelinit_server.engine import Sampler, cpu

    import torch

    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    sampler = Sampler("normal", std=0.02)
    for i, p in enumerate(model.parameters()):
        out = p.detach().view(-1).view(torch.uint8).numpy()
        cpu.generate_into(out, sampler, (i, 0), 0, p.numel(), names[p.dtype])


if __name__ == "__main__":
    main()

"""``modelinit.init_module_`` on 1, 2, ... ranks: each rank generates only its shards, so its time
should fall as 1/W at equal resources per rank.

    python benchmarks/init_module_ranks.py                              # worlds 1,2; fsdp and tp; TinyLlama-1.1B bf16
    python benchmarks/init_module_ranks.py --worlds 1,2,4 --layout fsdp --threads 1
    python benchmarks/init_module_ranks.py --layers 4 --repeat 3 --dtype float32
    python benchmarks/init_module_ranks.py --shape smoke --worlds 1 --layout tp --layers 1 --repeat 1  # does it run

For each world size W and layout, W processes are spawned (torch.multiprocessing, gloo, a
``file://`` rendezvous in a temporary directory). Each builds the same LlamaForCausalLM on the
meta device, parallelizes it on a 1-D CPU mesh of the W ranks, ``to_empty(device="cpu")``:

* ``fsdp``: FSDP2 ``fully_shard`` per decoder layer, then the root (every parameter ``Shard(0)``);
* ``tp``: tensor parallel, colwise q/k/v/gate/up and lm_head, rowwise o/down and the embedding
  (``Shard(1)`` of o/down: one run per row); norms stay whole on every rank.

Then one warm ``init_module_`` (numba compile or cache load, spec resolution), then ``--repeat``
timed calls, each after a barrier (outside the timing); a rank's figure is its best. Every rank
runs ``--threads`` torch and numba threads (default: cores // the largest world, at least 1), so
that worlds compare at equal resources per rank; ``--pin`` also pins rank r to its own cores.
Printed per world and layout: the per-rank wall (max and mean over ranks), the elements each rank
writes (``InitSummary.elements``; ``global_elements`` is the whole model), M elements/s per rank,
the speedup of the slowest rank over world 1's, and each call's CPU time (steadier than the wall
when something else shares the machine). A measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "server"))
sys.path.insert(0, str(REPO / "client"))

TINYLLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False)
#: A Llama small enough that a world's time is its ranks' start (the smoke run of tests/project/test_benchmarks.py).
SMOKE = dict(TINYLLAMA, vocab_size=1024, hidden_size=256, intermediate_size=704, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=256)
SHAPES = {"tinyllama-1.1b": TINYLLAMA, "smoke": SMOKE}


def _tp_plan(model) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"model.embed_tokens": RowwiseParallel(), "lm_head": ColwiseParallel()}
    for i in range(len(model.model.layers)):
        for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"model.layers.{i}.{n}"] = ColwiseParallel()
        for n in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{n}"] = RowwiseParallel()
    return plan


def _build(layout: str, world: int, shape: str, layers: int, dtype: str):
    """The model on meta, parallelized on a 1-D mesh of all ranks, then materialized."""
    import torch
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    doc = dict(SHAPES[shape], num_hidden_layers=layers)
    config = transformers.AutoConfig.for_model(doc.pop("model_type"), **doc)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=(layout,))
    if layout == "tp":
        parallelize_module(model, mesh, _tp_plan(model))
    else:
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    return model


def _worker(rank: int, world: int, tmp: str, layout: str, args: dict) -> None:
    threads = args["threads"]
    if args["pin"]:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cores[(rank * threads) % len(cores):][:threads] or cores[:threads])
    import numba
    import torch
    import torch.distributed as dist
    from modelinit_server.training import init_module_

    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world)
    try:
        t = time.perf_counter()
        model = _build(layout, world, args["shape"], args["layers"], args["dtype"])
        build = time.perf_counter() - t
        t = time.perf_counter()
        init_module_(model, seed=0)  # warm: numba compile/cache load, spec resolution
        warm = time.perf_counter() - t
        times, cpus = [], []
        for _ in range(args["repeat"]):
            dist.barrier()
            c, t = time.process_time(), time.perf_counter()
            summary = init_module_(model, seed=0)
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        dist.barrier()
        result = dict(rank=rank, best=min(times), times=times, cpu=min(cpus), warm=warm, build=build,
                      elements=summary.elements,
                      global_elements=summary.global_elements, tensors=summary.tensors,
                      fingerprint=summary.fingerprint, numba_threads=numba.get_num_threads(),
                      torch_threads=torch.get_num_threads())
        pathlib.Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_world(world: int, layout: str, args: dict) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="init-module-ranks-") as tmp:
        mp.spawn(_worker, args=(world, tmp, layout, args), nprocs=world, join=True)
        return [json.loads(pathlib.Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2", help="comma-separated world sizes (default 1,2)")
    ap.add_argument("--layout", default="fsdp,tp", help="fsdp, tp or both comma-separated (default fsdp,tp)")
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES), help="the Llama's shape (smoke: a small one)")
    ap.add_argument("--layers", type=int, default=TINYLLAMA["num_hidden_layers"])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per rank; a rank's figure is its best")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and numba threads per rank (default: max(1, cores // largest world))")
    ap.add_argument("--pin", action="store_true", help="pin rank r to cores [r*threads, (r+1)*threads)")
    a = ap.parse_args()

    worlds = [int(w) for w in a.worlds.split(",")]
    layouts = [x.strip() for x in a.layout.split(",")]
    if any(x not in ("fsdp", "tp") for x in layouts):
        sys.exit(f"--layout: {a.layout!r}: each must be fsdp or tp")
    cores = len(os.sched_getaffinity(0))
    threads = a.threads or max(1, cores // max(worlds))
    # read when numba / the OpenMP runtime load in the children (spawned: they inherit this environment)
    os.environ["NUMBA_NUM_THREADS"] = str(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    args = dict(shape=a.shape, layers=a.layers, dtype=a.dtype, repeat=a.repeat, threads=threads, pin=a.pin)
    print(f"LlamaForCausalLM ({a.shape} shape), {a.layers} layers, {a.dtype}; {cores} cores, "
          f"{threads} torch + numba threads per rank{', pinned' if a.pin else ''}; best of {a.repeat}")

    rows = []
    for layout in layouts:
        base = None
        for world in worlds:
            if world * threads > cores:
                print(f"note: world {world} x {threads} threads > {cores} cores: ranks share cores")
            res = run_world(world, layout, args)
            walls = [r["best"] for r in res]
            wmax, wmean = max(walls), sum(walls) / len(walls)
            if base is None:
                base = wmax
            fps = {r["fingerprint"] for r in res}
            rows.append((world, layout, wmax, wmean, res, base / wmax, fps))

    print()
    print(f"{'world':>5} {'layout':>6} {'max s':>7} {'mean s':>7} {'elements/rank':>15} {'of global':>9} "
          f"{'M el/s/rank':>11} {'speedup':>8} {'cpu s':>7} {'warm s':>7} {'build s':>7}")
    for world, layout, wmax, wmean, res, speedup, fps in rows:
        el = max(r["elements"] for r in res)
        glob = res[0]["global_elements"]
        rate = sum(r["elements"] / r["best"] for r in res) / len(res) / 1e6
        warm = max(r["warm"] for r in res)
        build = max(r["build"] for r in res)
        cpu = max(r["cpu"] for r in res)
        print(f"{world:>5} {layout:>6} {wmax:7.2f} {wmean:7.2f} {el:>15,} {el / glob:9.3f} {rate:11.0f} "
              f"{speedup:7.2f}x {cpu:7.2f} {warm:7.2f} {build:7.2f}")
        if len(fps) != 1:
            print(f"      warning: ranks disagree on the fingerprint: {sorted(fps)}")
    print("\nspeedup: the slowest rank of the first world (per layout) over this one's (ideal: W / W0)."
          "\nelements/rank: the most any rank writes; norms are whole on every rank under tp."
          "\ncpu s: the most CPU time (all of a rank's threads) any rank spent in one call, its least over the"
          "\nrepeats; unlike the wall, it hardly moves when other processes share the cores."
          "\nwarm s: the first call (numba compile or cache load, spec resolution); build s: meta build,"
          "\nparallelize, to_empty.")


if __name__ == "__main__":
    main()

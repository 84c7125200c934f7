"""Per-rank cost as the world grows: ``init_module_`` on one rank's share against each training
stack's own initialization, at world sizes 1, 2, 4 on the CPU.

    python benchmarks/init_module_stack_ranks.py                            # both stacks, Llama 3 1B, worlds 1,2,4
    python benchmarks/init_module_stack_ranks.py --stack megatron --layers 4 --worlds 1,2,4
    python benchmarks/init_module_stack_ranks.py --flavor debugmodel --layers 1 --worlds 1,2 --repeat 1

For each stack and world size W, W processes are started (torch.multiprocessing, forked from a
fork server that imported torch, numba, modelinit and the stacks once; gloo, a ``file://``
rendezvous in a temporary directory), each running ``--threads`` torch and numba
threads (default 1, so that worlds compare at equal resources per rank). The model is torchtitan's
Llama 3 ``--flavor`` shape (``--layers`` keeps its first layers), float32:

* ``megatron``: Megatron-Core's ``GPTModel`` of that shape (the Hugging Face config derived from
  the flavor, as benchmarks/init_module_stacks.py builds it: the local layer spec, TP=W, PP=1,
  ``use_cpu_initialization=True``). Megatron's own CPU init is timed as the constructor with
  ``perform_initialization=True`` less the constructor without it, each on fresh memory: every
  rank builds each full weight (``_initialize_affine_weight_cpu``) and keeps its slice, so its
  cost does not fall with TP. ``init_module_(model, spec=..., policy="megatron")`` fills a model
  built without init, drawing this rank's slices only.
* ``torchtitan``: torchtitan's model built on the meta device, FSDP2 ``fully_shard`` per block and
  then the root on a 1-D CPU mesh of the W ranks (what its ``parallelize_llama`` does for data
  parallelism), ``to_empty(device="cpu")``; torchtitan's own ``model.init_states()`` on it against
  ``init_module_(model, spec=...)``.

Per rank: one warm ``init_module_`` (numba's kernel load, the spec, the map), then ``--repeat``
rounds; in each, every measured call runs on a freshly built model (first touch of its memory
included, for theirs and ours alike) after a barrier, and a rank's figure is its best round. Both
the wall and the process CPU time of each call (``time.process_time``: all of the rank's threads)
are kept. With more ranks than cores (4 ranks on a 2-core machine) the ranks share the cores, so
the wall per rank grows with W for everyone: the CPU time per rank is the steady figure, and the
headline. Printed per stack and W: the slowest rank's CPU seconds and wall, theirs, ours, the
ratio theirs / ours, the share of the model's elements a rank writes, and the largest peak RSS of
any rank (``ru_maxrss``). ``--json PATH`` writes every rank's figures.

Memory: each of Megatron's ranks holds a whole weight while it inits it, and torchtitan's
``init_states()`` took one rank to 12 GB for 4 blocks of 1B (a 2 GB model) at world 1: on a small
machine, cut the model with ``--layers``. torchtitan comes from ``tests/.stacks``
(``tests/support/stacks.py`` installs it; this script puts the folder on the path); megatron-core
is in the test extra. A measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import resource
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
for path in (ROOT / "tests" / ".stacks", ROOT / "server", ROOT / "client", ROOT / "proto"):
    sys.path.insert(0, str(path))

#: torchtitan's Llama 3 flavors (torchtitan.models.llama3's model_registry).
FLAVORS = ("debugmodel", "1B", "3B", "8B")


def titan_config(flavor: str, layers: int | None):
    """torchtitan's Llama 3 ``flavor`` config, its first ``layers`` blocks kept (all if None)."""
    from torchtitan.models.llama3 import model_registry

    config = model_registry(flavor, attn_backend="flex").model
    if layers is not None:
        config.layers = config.layers[:layers]
    return config


def hf_config(flavor: str, layers: int | None) -> dict:
    """The Hugging Face config of that model, as ``init_module_`` derives it from the model itself."""
    import torch

    from modelinit_server.training.torchtitan_config import own_config

    with torch.device("meta"):
        return own_config(titan_config(flavor, layers).build())


def measured(fn) -> dict:
    """``fn()``'s wall and process CPU seconds, after a barrier of all ranks (outside the timing)."""
    import torch.distributed as dist

    dist.barrier()
    c, t = time.process_time(), time.perf_counter()
    fn()
    return {"wall": time.perf_counter() - t, "cpu": time.process_time() - c}


def on_fresh(build, call) -> dict:
    """``call(model)`` measured on a model just built by ``build()``, dropped before the next is built."""
    model = build()
    return measured(lambda: call(model))


def best(rounds: list[dict]) -> dict:
    """The least wall and the least CPU time over the rounds (each taken on its own)."""
    return {k: min(r[k] for r in rounds) for k in ("wall", "cpu")}


def megatron_rank(world: int, args: dict) -> dict:
    """Megatron's CPU init (constructor with it less without it) and ``init_module_`` on this TP rank."""
    import warnings

    import modelinit
    from init_module_stacks import megatron_gpt  # this folder's script: the same model as its one-process figures

    warnings.filterwarnings("ignore")  # Megatron warns that Apex and Transformer Engine are absent
    from megatron.core import parallel_state as ps

    hf = args["hf"]
    ps.initialize_model_parallel(tensor_model_parallel_size=world)

    def build(perform: bool):
        return megatron_gpt(hf, perform, tp=world)

    def fill(model):
        return modelinit.init_module_(model, seed=0, spec=hf, policy="megatron")

    summary = fill(build(False))  # warm: numba's kernel load, the spec, the map
    bare, with_init, ours = [], [], []
    for _ in range(args["repeat"]):
        bare.append(measured(lambda: build(False)))
        with_init.append(measured(lambda: build(True)))
        ours.append(on_fresh(lambda: build(False), fill))
    b, w = best(bare), best(with_init)
    ps.destroy_model_parallel()
    return {"theirs": {k: w[k] - b[k] for k in b}, "ours": best(ours), "built_bare": b, "built_with_init": w,
            "elements": summary.elements, "global_elements": summary.global_elements}


def torchtitan_rank(world: int, args: dict) -> dict:
    """torchtitan's ``init_states()`` and ``init_module_`` on this rank's FSDP2 shards."""
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import modelinit

    warnings.filterwarnings("ignore", "DTensor random operators")  # init_states' normals on a CPU mesh
    mesh = init_device_mesh("cpu", (world,))

    def fresh():
        """A newly sharded and materialized model: its memory untouched, as after the trainer's to_empty."""
        with torch.device("meta"):
            model = titan_config(args["flavor"], args["layers"]).build()
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model.to_empty(device="cpu")

    def fill(model):
        return modelinit.init_module_(model, seed=0, spec=args["hf"])

    summary = fill(fresh())  # warm
    theirs, ours = [], []
    for _ in range(args["repeat"]):
        theirs.append(on_fresh(fresh, lambda model: model.init_states(buffer_device=torch.device("cpu"))))
        ours.append(on_fresh(fresh, fill))
    return {"theirs": best(theirs), "ours": best(ours), "elements": summary.elements,
            "global_elements": summary.global_elements}


STACKS = {"megatron": megatron_rank, "torchtitan": torchtitan_rank}


def worker(rank: int, world: int, tmp: str, stack: str, args: dict) -> None:
    import numba
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args["threads"])
    numba.set_num_threads(args["threads"])
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world)
    try:
        result = STACKS[stack](world, args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    result.update(rank=rank, peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    pathlib.Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))


#: What a rank imports, per stack: the fork server imports it once (:func:`run_world`).
PRELOAD = {"megatron": ("megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.parallel_state"),
           "torchtitan": ("torch.distributed.device_mesh", "torch.distributed.fsdp", "torchtitan.models.llama3")}


def run_world(stack: str, world: int, args: dict) -> list[dict]:
    """Every rank's figures for ``stack`` at world size ``world``. The ranks are forked from a fork
    server that imported torch, numba, modelinit and the stacks once (``PRELOAD``): each rank
    starts as a fresh process would, without paying those imports again (Megatron-Core alone is
    about 4 s); nothing timed here includes a process's start."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="init-module-stack-ranks-") as tmp:
        mp.start_processes(worker, args=(world, tmp, stack, args), nprocs=world, join=True, start_method="forkserver")
        return [json.loads(pathlib.Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def row(world: int, ranks: list[dict]) -> dict:
    """The slowest rank's figures (each taken on its own), the ratios theirs / ours, the largest RSS."""
    out = {"world": world, "peak_rss_gb": max(r["peak_rss_gb"] for r in ranks),
           "share": max(r["elements"] for r in ranks) / ranks[0]["global_elements"]}
    for who in ("theirs", "ours"):
        for k in ("cpu", "wall"):
            out[f"{who}_{k}"] = max(r[who][k] for r in ranks)
    out["ratio_cpu"] = out["theirs_cpu"] / out["ours_cpu"]
    out["ratio_wall"] = out["theirs_wall"] / out["ours_wall"]
    return out


NAMES = {"megatron": "Megatron's CPU init", "torchtitan": "torchtitan init_states()"}


def report(stack: str, rows: list[dict]) -> None:
    print(f"\n{stack}: per rank, the slowest rank's best; theirs = {NAMES[stack]}, ours = init_module_")
    print(f"{'W':>3} {'share':>6} {'theirs cpu s':>12} {'ours cpu s':>10} {'ratio cpu':>9} "
          f"{'theirs wall s':>13} {'ours wall s':>11} {'ratio wall':>10} {'peak RSS GB':>11}")
    for r in rows:
        print(f"{r['world']:>3} {r['share']:6.3f} {r['theirs_cpu']:12.2f} {r['ours_cpu']:10.2f} "
              f"{r['ratio_cpu']:8.2f}x {r['theirs_wall']:13.2f} {r['ours_wall']:11.2f} {r['ratio_wall']:9.2f}x "
              f"{r['peak_rss_gb']:11.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flavor", default="1B", choices=FLAVORS)
    ap.add_argument("--layers", type=int, default=None, help="keep the flavor's first LAYERS blocks (default all)")
    ap.add_argument("--worlds", default="1,2,4", help="comma-separated world sizes (default 1,2,4)")
    ap.add_argument("--stack", default="both", choices=("both", "megatron", "torchtitan"))
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds per rank; a rank's figure is its best")
    ap.add_argument("--threads", type=int, default=1, help="torch and numba threads per rank (default 1)")
    ap.add_argument("--json", type=pathlib.Path, help="write every rank's figures here")
    a = ap.parse_args()

    worlds = [int(w) for w in a.worlds.split(",")]
    stacks = ["megatron", "torchtitan"] if a.stack == "both" else [a.stack]
    # read when numba / the OpenMP runtime load in the fork server (it inherits this environment; the ranks inherit its state)
    os.environ["NUMBA_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # before the fork server starts (on the first world): it imports these with this environment
    multiprocessing.set_forkserver_preload(["numba", "torch", "torch.distributed", "modelinit", "modelinit_server.training",
                                            "init_module_stacks", *(m for st in stacks for m in PRELOAD[st])])
    hf = hf_config(a.flavor, a.layers)
    args = dict(flavor=a.flavor, layers=a.layers, hf=hf, repeat=a.repeat, threads=a.threads)
    cores = len(os.sched_getaffinity(0))
    print(f"Llama 3 {a.flavor} shape, {hf['num_hidden_layers']} layers, float32, CPU; {cores} cores, "
          f"{a.threads} torch + numba threads per rank; best of {a.repeat}; worlds {a.worlds}")
    if max(worlds) * a.threads > cores:
        print(f"note: {max(worlds)} ranks x {a.threads} threads > {cores} cores: the ranks share the cores, "
              "so the wall per rank grows with W; CPU seconds per rank are the steady figure")
    results = {}
    for stack in stacks:
        results[stack] = {w: run_world(stack, w, args) for w in worlds}
        report(stack, [row(w, ranks) for w, ranks in results[stack].items()])
    print("\nshare: the most of the model's elements any rank writes (init_module_'s elements / global_elements)."
          "\ncpu s: the process CPU time of one call (all of a rank's threads); wall s: its wall time."
          "\nratio: theirs / ours (above 1: init_module_ is faster). Megatron's figure is the constructor with"
          "\nits CPU init less the constructor without it.")
    if a.json:
        a.json.write_text(json.dumps({"config": args, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""``init_module_`` on CUDA for the native training stacks (issue 46's GPU list): a torchtitan Llama 3
and a Megatron-Core ``GPTModel`` (local layer spec) built on the GPU as their stacks build them, filled
there by the Triton kernels, hold every parameter's bytes of the same model filled on the CPU (whose
bytes test_torchtitan.py and test_megatron.py compare with the Hugging Face folder). The filled
GPTModel then runs one forward pass (Megatron's forward needs CUDA: its RNG tracker, its causal mask):
the loss at init is about ln V. (A transformers model on CUDA is test_init_module.py's ``-k cuda``.)

Every test skips without a CUDA GPU; ``benchmarks/gpu_session.sh tests`` runs this file (its
``stacks`` step). Nothing heavy is imported here at import time: torchtitan (``tests/.stacks``) and
megatron-core are imported by the tests that need them, which skip without them.
"""
from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Megatron warns that Apex/TE are absent


# --- torchtitan ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torchtitan():
    from tests.support.stacks import install_torchtitan

    return install_torchtitan()


#: The torchtitan models filled on CUDA: the tests' Llama 3, and two flavors with grouped experts
#: (``GroupedExperts``: one 3-D weight per kind of projection), Qwen3-MoE's and DeepSeek-V3's (MLA too).
TITAN_FLAVORS = ("llama3", "qwen3_moe", "deepseek_v3")


def titan_model(flavor: str, fsdp_mesh=None):
    """The flavor's torchtitan model on the meta device and its Hugging Face spec; with ``fsdp_mesh``,
    its blocks and the whole model under FSDP2 (fully_shard), as torchtitan's parallelize does."""
    from tests.support.torchtitan_models import DEEPSEEK_V3, HF, QWEN3_MOE, flavor_model, meta_model

    model, spec = {"llama3": lambda: (meta_model(), HF), "qwen3_moe": lambda: (flavor_model("debugmodel_moe"), QWEN3_MOE),
                   "deepseek_v3": lambda: (flavor_model("deepseek_v3"), DEEPSEEK_V3)}[flavor]()
    if fsdp_mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers.values():
            fully_shard(layer, mesh=fsdp_mesh)
        fully_shard(model, mesh=fsdp_mesh)
    return model, spec


def titan_filled(device: str, dtype: str, flavor: str = "llama3") -> tuple[dict, dict]:
    """The flavor's torchtitan model materialized on ``device`` in ``dtype`` and filled there: its
    parameters and buffers, on the CPU."""
    import modelinit
    from tests.support.torchtitan_models import SEED

    model, spec = titan_model(flavor)
    model = model.to_empty(device=device)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    modelinit.init_module_(model, seed=SEED, spec=spec)  # the RoPE tables (buffers): torchtitan's own code, on device
    assert all(p.device.type == torch.device(device).type for p in model.parameters())
    return ({n: p.detach().cpu() for n, p in model.named_parameters()},
            {n: b.detach().cpu() for n, b in model.named_buffers()})


@needs_cuda
@pytest.mark.parametrize("flavor, dtype", [("llama3", "float32"), ("llama3", "bfloat16"), ("qwen3_moe", "float32"),
                                           ("deepseek_v3", "bfloat16")])
def test_torchtitan_on_cuda_equals_the_cpu_bytes(torchtitan, flavor, dtype):
    from tests.support.distributed import same_bytes

    gpu, gpu_buffers = titan_filled("cuda", dtype, flavor)
    cpu, cpu_buffers = titan_filled("cpu", dtype, flavor)
    assert sorted(gpu) == sorted(cpu)
    assert [n for n in cpu if not same_bytes(gpu[n], cpu[n])] == []
    # The RoPE tables are torchtitan's own (not modelinit's bytes): computed on each device by its code, close.
    assert sorted(gpu_buffers) == sorted(cpu_buffers)
    for n, b in cpu_buffers.items():
        if b.is_floating_point():
            torch.testing.assert_close(gpu_buffers[n], b, rtol=1e-5, atol=1e-5, msg=n)
        else:
            assert torch.equal(gpu_buffers[n], b), n


def _titan_fsdp_world_of_one(rank: int, init_file: str, flavor: str) -> None:
    """Grouped experts and MLA under FSDP2 on CUDA (an NCCL group of one: one shard, through the DTensor
    path): the CPU bytes of the unwrapped model."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import modelinit
    from tests.support.distributed import exit_rank, same_bytes
    from tests.support.stacks import install_torchtitan
    from tests.support.torchtitan_models import SEED

    install_torchtitan()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=0, world_size=1)
    cpu, _ = titan_filled("cpu", "float32", flavor)
    model, spec = titan_model(flavor, fsdp_mesh=init_device_mesh("cuda", (1,)))
    model.to_empty(device="cuda")
    modelinit.init_module_(model, seed=SEED, spec=spec)
    params = dict(model.named_parameters())
    assert all(isinstance(p, DTensor) for p in params.values())
    got = {n: p.full_tensor().cpu() for n, p in params.items()}
    assert sorted(got) == sorted(cpu)
    assert [n for n in cpu if not same_bytes(got[n], cpu[n])] == []
    dist.barrier()
    exit_rank()


@needs_cuda
@pytest.mark.parametrize("flavor", ["qwen3_moe", "deepseek_v3"])
def test_torchtitan_grouped_experts_under_fsdp2_on_cuda_equal_the_cpu_bytes(torchtitan, tmp_path, flavor):
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_titan_fsdp_world_of_one, args=(str(tmp_path / "pg"), flavor), nprocs=1, join=True)


def _titan_fsdp_rank(rank: int, world: int, init_file: str, ref_path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import modelinit
    from tests.support.distributed import exit_rank, no_collectives, same_bytes
    from tests.support.stacks import install_torchtitan
    from tests.support.torchtitan_models import HF, SEED, meta_model

    install_torchtitan()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = meta_model()
    mesh = init_device_mesh("cuda", (world,))
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cuda")
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec=HF)
    assert summary.elements < summary.global_elements  # each rank filled its shards only
    ref = torch.load(ref_path)
    got = {n: p.full_tensor().cpu() for n, p in model.named_parameters()}  # gathered after the fill
    assert [n for n in ref if not same_bytes(got[n], ref[n])] == []
    dist.barrier()
    exit_rank()


@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (FSDP2 over 2 ranks)")
def test_torchtitan_llama3_fsdp2_on_two_gpus_equals_the_cpu_bytes(torchtitan, tmp_path):
    import torch.multiprocessing as mp

    cpu, _ = titan_filled("cpu", "float32")
    torch.save(cpu, tmp_path / "ref.pt")
    mp.spawn(_titan_fsdp_rank, args=(2, str(tmp_path / "pg"), str(tmp_path / "ref.pt")), nprocs=2, join=True)


# --- Megatron-Core ------------------------------------------------------------------------------------

def megatron_filled(device: str, dtype: str, moe: bool = False, te_experts: bool = False, te_spec: bool = False):
    """The tests' GPTModel (megatron_models.megatron_gpt: TP=1, PP=1, local spec) built as Megatron
    builds it on ``device`` (on CUDA: ``use_cpu_initialization=False``, its linears and embedding made on
    ``torch.cuda.current_device()``, then the whole module moved there as megatron.training's get_model
    does) and filled there: the model and its parameters, on the CPU. ``moe``: with SequentialMLP experts
    and their router (the local spec's experts); ``te_experts``: Transformer Engine's TEGroupedMLP experts
    (the real one: the machine's Transformer Engine); ``te_spec``: Megatron's Transformer Engine layer spec.
    Megatron's parallel state must be set up (a group of one)."""
    import modelinit
    from tests.support.megatron_models import HF, MOE, SEED, megatron_gpt

    grouped = dict(te_experts=True, moe_grouped_gemm=True) if te_experts else {}
    model = megatron_gpt(dtype=dtype, use_cpu_initialization=device == "cpu", moe=moe, te_spec=te_spec, **grouped)
    if device == "cuda":  # the norms (torch's own, in the local spec) are made on the CPU: Megatron's get_model
        model.cuda(torch.cuda.current_device())  # moves every module to the GPU, as here
    assert all(p.device.type == device for p in model.parameters())
    modelinit.init_module_(model, seed=SEED, spec=MOE if moe else HF)
    return model, {n: p.detach().cpu() for n, p in model.named_parameters()}


def megatron_loss(model, vocab: int, batch: int = 2, seq: int = 32) -> float:
    """One forward pass of the filled GPTModel on random tokens and labels: the mean per-token loss.
    GPTModel.forward(input_ids, position_ids, attention_mask, labels=...) returns the per-token cross
    entropy ([b, s]); the local spec's DotProductAttention is causal and makes its own causal mask
    when ``attention_mask`` is None."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    labels = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    positions = torch.arange(seq, device=device).unsqueeze(0).expand(batch, seq)
    model.eval()
    with torch.no_grad():
        losses = model(tokens, positions, attention_mask=None, labels=labels)
    assert losses.shape == (batch, seq), losses.shape
    return losses.float().mean().item()


def _megatron_on_cuda(rank: int, init_file: str, dtype: str, moe: bool) -> None:
    """In a process of its own with an NCCL group of one: the GPTModel built and filled on CUDA equals
    the CPU-built one filled on the CPU, byte for byte; then one forward pass."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from tests.support.distributed import exit_rank, same_bytes
    from tests.support.megatron_models import PADDED, SEED

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=1)
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(SEED)  # Megatron's forward forks its CUDA RNG tracker
    _, cpu = megatron_filled("cpu", dtype, moe)
    model, gpu = megatron_filled("cuda", dtype, moe)
    assert sorted(gpu) == sorted(cpu)
    assert [n for n in cpu if not same_bytes(gpu[n], cpu[n])] == []
    if dtype == "float32" and not moe:  # bfloat16 runs under Megatron's Float16Module in training (norms in float32 here)
        loss = megatron_loss(model, PADDED)
        # At init the logits are small: the final RMSNorm gives the hidden state RMS 1 and the output
        # layer's weights have the hf default std 0.02, so over hidden 64 the logits have std about
        # 0.02 * sqrt(64) = 0.16 and the loss is ln V + 0.16**2 / 2 (about ln V + 0.013), V the padded
        # vocabulary the output layer's softmax runs over (1024). |loss - ln V| < 0.1 ln V (0.69) leaves
        # room for any sampling noise and fails a scale off by orders of magnitude (std 1: loss ~ 8 + ln V).
        assert math.isfinite(loss), loss
        assert abs(loss - math.log(PADDED)) < 0.1 * math.log(PADDED), loss
    dist.barrier()
    exit_rank()


@needs_cuda
@pytest.mark.parametrize("dtype, moe", [("float32", False), ("bfloat16", False), ("float32", True)],
                         ids=["float32", "bfloat16", "moe-float32"])
def test_megatron_gpt_on_cuda_equals_the_cpu_bytes_and_runs_forward(tmp_path, dtype, moe):
    """The GPTModel built on CUDA (use_cpu_initialization=False), filled there, equals the CPU-built one
    filled on the CPU; float32: one forward pass, the loss at init about ln V."""
    import torch.multiprocessing as mp

    pytest.importorskip("megatron.core", reason="megatron-core (.whl/ on the device machine)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_megatron_on_cuda, args=(str(tmp_path / "pg"), dtype, moe), nprocs=1, join=True)


def _megatron_te_on_cuda(rank: int, init_file: str, layers: str) -> None:
    """A group of one: a GPTModel with Transformer Engine's layers built on CUDA and filled there (the
    refusal's switch set, as this run verifies it) holds the bytes of the same model with local modules
    filled on the CPU; then one forward pass. ``layers``: ``layer-spec`` (Megatron's Transformer Engine
    layer spec: the norms fused into the linears after them, under those names) or ``grouped-experts``
    (TEGroupedMLP experts in a local-spec MoE model: expert i's weight{i} is SequentialMLP's expert i)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from modelinit_server.training.megatron import refusals
    from tests.support.distributed import exit_rank, same_bytes
    from tests.support.megatron_models import PADDED, SEED, in_te_spec_names
    from tests.support.megatron_te import as_sequential_experts

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=1)
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(SEED)
    moe = layers == "grouped-experts"
    _, cpu = megatron_filled("cpu", "float32", moe=moe)
    if moe:
        refusals.TE_GROUPED_EXPERTS_VERIFIED = True  # what this test verifies
        model, gpu = megatron_filled("cuda", "float32", moe=True, te_experts=True)
        assert type(model.decoder.layers[0].mlp.experts).__name__ == "TEGroupedMLP"
        gpu = as_sequential_experts(gpu)
    else:
        refusals.TE_LAYER_SPEC_VERIFIED = True
        model, gpu = megatron_filled("cuda", "float32", te_spec=True)
        assert type(model.decoder.layers[0].self_attention.linear_qkv).__name__ == "TELayerNormColumnParallelLinear"
        cpu = in_te_spec_names(cpu)
    assert sorted(gpu) == sorted(cpu)
    assert [n for n in cpu if not same_bytes(gpu[n], cpu[n])] == []
    loss = megatron_loss(model, PADDED)  # at init about ln V (_megatron_on_cuda says why)
    assert math.isfinite(loss) and abs(loss - math.log(PADDED)) < 0.1 * math.log(PADDED), loss
    dist.barrier()
    exit_rank()


@needs_cuda
@pytest.mark.parametrize("layers", ["layer-spec", "grouped-experts"])
def test_megatron_transformer_engine_layers_on_cuda_equal_the_cpu_bytes(tmp_path, layers):
    """Megatron's Transformer Engine layers built on CUDA with the machine's Transformer Engine and
    filled there: the layer spec (``get_gpt_layer_with_transformer_engine_spec``) and TEGroupedMLP
    experts (the only grouped experts Megatron-Core 0.17 and later have), each the CPU local-spec
    model's bytes; the forward runs. Passing here is what lets ``TE_LAYER_SPEC_VERIFIED`` and
    ``TE_GROUPED_EXPERTS_VERIFIED`` (training/megatron/refusals.py) be set."""
    import importlib.util

    import torch.multiprocessing as mp

    pytest.importorskip("megatron.core", reason="megatron-core (.whl/ on the device machine)")
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.skip("Transformer Engine is not installed on this machine (its wheel, about 276 MB, exceeds what a "
                    "device run carries; an image with it runs this)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_megatron_te_on_cuda, args=(str(tmp_path / "pg"), layers), nprocs=1, join=True)

"""modelinit turned on from torchtitan's own configuration (``--override.imports
modelinit_server.training.torchtitan_hook.modelinit_init={"seed": ...}``), with torchtitan's trainer
unedited: the override sets ``param_init`` on every module config, so the trainer's own flow (build
on meta, parallelize or split into pipeline stages, ``to_empty``, ``init_weights``) fills the model
with the bytes of the Hugging Face folder of its config.

The override is applied as torchtitan's trainer applies it: the CLI tokens through
``parse_cli_imports``, then ``apply_overrides`` on the tree that holds the model's config (the
trainer passes its whole config; here the ``ModelSpec``, the node that holds the model's). The
reference is the folder as torchtitan loads it (tests/support/torchtitan_models.folder_as_loaded).
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from tests.support.distributed import exit_rank, same_bytes, spawn  # noqa: E402
from tests.support.stacks import install_torchtitan  # noqa: E402
from tests.support.torchtitan_models import HF, SEED, folder_as_loaded, titan_config, titan_parallelized  # noqa: E402

HOOK = "modelinit_server.training.torchtitan_hook.modelinit_init"
#: The override's kwargs as a user gives them on the command line.
SEEDED = json.dumps({"seed": SEED})


@pytest.fixture(scope="module", autouse=True)
def torchtitan():
    return install_torchtitan()


def hooked_config(kwargs: str):
    """The test's Llama 3 config after torchtitan applies ``--override.imports HOOK=<kwargs>``."""
    from torchtitan.config.override import OverrideConfig, apply_overrides, parse_cli_imports
    from torchtitan.models.llama3 import model_registry

    spec = model_registry("debugmodel", attn_backend="flex")
    spec.model = titan_config()
    replaced = apply_overrides(OverrideConfig(imports=parse_cli_imports([f"{HOOK}={kwargs}"])), spec)
    assert replaced == [f"[Override] {HOOK}: model Llama3Model.Config -> Llama3Model.Config with "
                        + ", ".join(f"{k}={v!r}" for k, v in json.loads(kwargs).items())]
    return spec.model


def _materialized(model):
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


@pytest.mark.parametrize("kwargs", [SEEDED, json.dumps({"seed": SEED, "spec": HF})],
                         ids=["config-derived", "spec-given"])
def test_the_trainers_own_init_weights_fills_the_folder(tmp_path, kwargs):
    """One device: build on meta, ``to_empty``, ``init_weights`` (the trainer's calls): every parameter
    is the folder's bytes, derived from the model's config or with the spec given; the RoPE tables
    (buffers) are torchtitan's own."""
    with torch.device("meta"):
        model = hooked_config(kwargs).build()
    _materialized(model).init_weights(buffer_device=None)
    ref = folder_as_loaded(tmp_path, "float32")
    got = {n: p.detach() for n, p in model.named_parameters()}
    assert sorted(got) == sorted(ref)
    assert [n for n in ref if not same_bytes(got[n], ref[n])] == []
    with torch.device("meta"):
        fresh = titan_config().build()
    fresh.layers["0"].attention.rope.to_empty(device="cpu")
    fresh.layers["0"].attention.rope.init_states()
    assert torch.equal(model.layers["0"].attention.rope.cache, fresh.layers["0"].attention.rope.cache)


def test_each_pipeline_stage_fills_the_whole_models_bytes(tmp_path):
    """torchtitan's own pipeline split (``_split_module``: each stage a copy of the model without the
    other stages' layers), then each stage's ``init_weights``: the stages together hold the folder, each
    tensor once."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _split_module

    with torch.device("meta"):
        whole = hooked_config(SEEDED).build()
    ref = folder_as_loaded(tmp_path, "float32")
    held: dict[str, list] = {}
    for modules in _generate_llm_fqn_per_model_part(2, len(whole.layers)):
        stage = _materialized(_split_module(whole, modules))
        stage.init_weights(buffer_device=None)
        for n, p in stage.named_parameters():
            held.setdefault(n, []).append(p.detach().clone())
    assert sorted(held) == sorted(ref) and all(len(ts) == 1 for ts in held.values())
    assert [n for n in ref if not same_bytes(held[n][0], ref[n])] == []


def test_a_bad_seed_policy_or_spec_is_refused_when_the_override_is_applied():
    """A missing or negative seed, an unknown policy, a spec the model does not match: refused by name as
    torchtitan applies the override, before the trainer builds the model."""
    with pytest.raises(TypeError, match="seed"):
        hooked_config("{}")
    with pytest.raises(ValueError, match=r"^modelinit_init: seed is -1; give a non-negative integer"):
        hooked_config('{"seed": -1}')
    with pytest.raises(ValueError, match="no-such-preset"):
        hooked_config(json.dumps({"seed": SEED, "policy": "no-such-preset"}))
    with pytest.raises(ValueError, match=r"^module: the spec's '[^']+' \(and \d+ more\) is in no parameter of Llama3Model: "
                                         r"the model does not match the spec$"):
        hooked_config(json.dumps({"seed": SEED, "spec": {**HF, "num_hidden_layers": 3}}))


def _worker(rank: int, world: int, init_file: str, ref_path: str) -> None:
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ref = torch.load(ref_path)
        for degrees in ({}, {"tensor_parallel_degree": 2}):  # FSDP2; TP
            model = _materialized(titan_parallelized(hooked_config(SEEDED), world, **degrees))
            model.init_weights(buffer_device=None)
            params = dict(model.named_parameters())
            assert all(isinstance(p, DTensor) for p in params.values()), degrees
            full = {n: p.full_tensor().detach() for n, p in params.items()}
            if rank == 0:
                assert [n for n in ref if not same_bytes(full[n], ref[n])] == [], degrees
            dist.barrier()
        exit_rank()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_torchtitans_own_parallelize_then_init_weights_fills_the_folder(tmp_path):
    """Over 2 ranks, torchtitan's own ``parallelize_llama`` (FSDP2, then TP), ``to_empty`` and
    ``init_weights``: each rank fills its shards; the gathered parameters are the folder's bytes."""
    ref_path = str(tmp_path / "ref.pt")
    torch.save(folder_as_loaded(tmp_path, "float32"), ref_path)
    spawn(_worker, (2, str(tmp_path / "pg"), ref_path), 2)

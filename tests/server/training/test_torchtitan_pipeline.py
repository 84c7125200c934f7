"""``init_module_`` on the model parts torchtitan's trainer holds (issue 43): several pipeline stages
per rank, as its looped (Interleaved1F1B) and V-shaped (ZBVZeroBubble) schedules place them, and
blocks wrapped by its own activation checkpointing and per-block ``torch.compile``.

No spec is given: each part derives the whole model's Hugging Face config from its own
``model.config`` (a stage keeps the whole model's). The reference is that config's folder, written
by ``modelinit init`` and read back the way torchtitan loads a Hugging Face checkpoint (its
adapter's ``from_hf``, then the model's load hook).
"""
from __future__ import annotations

import dataclasses
import types

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import modelinit  # noqa: E402

from tests.support.torchtitan_models import SEED, with_kv_heads  # noqa: E402
from tests.support.distributed import same_bytes  # noqa: E402
from tests.support.stacks import install_torchtitan  # noqa: E402

LAYERS = 4
"""torchtitan's Llama 3 debugmodel cut to 4 layers (4 KV heads): 4 stages, 2 per rank on 2 PP ranks."""


@pytest.fixture(scope="module", autouse=True)
def torchtitan():
    return install_torchtitan()


def titan_config():
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel", attn_backend="flex").model
    layers = [dataclasses.replace(layer, attention=with_kv_heads(layer.attention, 4)) for layer in config.layers[:LAYERS]]
    return dataclasses.replace(config, layers=layers)


def meta_model():
    with torch.device("meta"):
        return titan_config().build()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The derived config's folder as torchtitan loads it: parameter name -> tensor."""
    from modelinit_server.training.torchtitan_config import own_config
    from modelinit_server.training.torchtitan_layout import _adapter

    out = tmp_path_factory.mktemp("hf-pipeline")
    with modelinit.Client() as c:
        c.init_model(own_config(meta_model()), seed=SEED, out_dir=out)
    files = {}
    for f in out.glob("*.safetensors"):
        files.update(safetensors_torch.load_file(f))
    model = meta_model().to_empty(device="cpu")
    model.load_state_dict(_adapter(model).from_hf(files))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("schedule, placed", [("Interleaved1F1B", [(0, 2), (1, 3)]), ("ZBVZeroBubble", [(0, 3), (1, 2)])])
@pytest.mark.parametrize("calls", ["per stage", "the rank's list", "a ModuleList"])
def test_each_ranks_stages_hold_the_whole_models_bytes(reference, schedule, placed, calls):
    """Each PP rank's stages, as torchtitan's ``_pipeline_module_split`` builds them (its
    ``_get_pp_rank_to_stage_indices_mapping`` for the schedule, then ``_split_module`` per stage),
    filled with no spec by one ``init_module_(stage, partial=True)`` per stage, or by one call with
    the rank's ``model_parts`` (a list, or a ``ModuleList``). Every stage's tensors are the
    folder's, the stages of all ranks hold every tensor once, and each reports the whole model's
    fingerprint and config; a call with the list sums its parts' and counts as missing what none
    of them holds."""
    from modelinit_server.architectures import from_config
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part, _get_pp_rank_to_stage_indices_mapping, _split_module)

    whole = meta_model()
    fqns = _generate_llm_fqn_per_model_part(4, LAYERS)
    seen: list[str] = []
    fingerprints, configs = set(), []
    for rank, want in enumerate(placed):
        indices = _get_pp_rank_to_stage_indices_mapping(rank, 2, schedule, len(fqns))
        assert indices == want
        model_parts = [_split_module(whole, fqns[i]).to_empty(device="cpu") for i in indices]
        if calls == "per stage":
            summaries = [modelinit.init_module_(stage, seed=SEED, partial=True) for stage in model_parts]
        else:
            given = model_parts if calls == "the rank's list" else torch.nn.ModuleList(model_parts)
            summary = modelinit.init_module_(given, seed=SEED, partial=True)
            summaries = list(summary.parts)
            stored = len(from_config(summary.derived_config).tensors)
            assert summary.missing == stored - sum(stored - s.missing for s in summaries) > 0
            assert (summary.tensors, summary.elements) == (sum(s.tensors for s in summaries),
                                                           sum(s.elements for s in summaries))
            assert summary.fingerprint == summaries[0].fingerprint
        assert len(summaries) == len(model_parts)
        for stage, summary in zip(model_parts, summaries):
            got = {n: p.detach() for n, p in stage.named_parameters()}
            assert [n for n in got if not same_bytes(got[n], reference[n])] == []
            assert summary.missing > 0 and summary.tensors == len(got)
            fingerprints.add(summary.fingerprint)
            configs.append(summary.derived_config)
            seen += got
    assert sorted(seen) == sorted(reference)  # every tensor in exactly one stage
    assert len(fingerprints) == 1 and all(c == configs[0] for c in configs)
    assert configs[0]["num_hidden_layers"] == LAYERS


@pytest.mark.parametrize("given", ["derived", "a dict"])
def test_a_list_of_stages_reads_the_spec_and_plans_once(reference, monkeypatch, given):
    """The rank's stages are parts of one model: the call reads the spec (derived by each part, or
    the one given) and resolves the policy over it once, not once per stage (for a large model each
    resolution is seconds); every stage still gets the folder's bytes. A stage whose spec differed
    would be planned for itself (the parts of two models are refused, tested below)."""
    from modelinit_server.training import job as training  # where init_module_ reads the spec and plans
    from modelinit_server.training.torchtitan_config import own_config
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _split_module

    calls = {"spec_of": 0, "resolve_request": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    for name in calls:
        monkeypatch.setattr(training, name, counted(name, getattr(training, name)))
    whole = meta_model()
    fqns = _generate_llm_fqn_per_model_part(4, LAYERS)
    parts = [_split_module(whole, fqns[i]).to_empty(device="cpu") for i in range(4)]
    spec = None if given == "derived" else own_config(whole)
    summary = modelinit.init_module_(parts, seed=SEED, partial=True, spec=spec)
    assert calls == {"spec_of": 1, "resolve_request": 1}
    assert summary.missing == 0 and len(summary.parts) == 4
    got = {n: p.detach() for part in parts for n, p in part.named_parameters()}
    assert sorted(got) == sorted(reference)
    assert [n for n in got if not same_bytes(got[n], reference[n])] == []


def test_a_list_of_stages_without_partial_is_refused_before_anything_is_written():
    """One rank's stages lack the other rank's: without ``partial=True`` the list is refused as
    its first stage would be, naming a tensor and the fix, and no stage is written (the second
    stage, which holds the head, neither); an empty list and parts of two different models are
    refused too."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _split_module

    whole = meta_model()
    fqns = _generate_llm_fqn_per_model_part(4, LAYERS)
    parts = [_split_module(whole, fqns[i]).to_empty(device="cpu") for i in (0, 2)]
    for part in parts:
        for p in part.parameters():
            p.data.fill_(7.0)
    with pytest.raises(ValueError, match=r"^module: it lacks \d+ tensor\(s\) of the spec, e\.g\. "
                                         r"'model\.layers\.\d\.[a-z_.]+'; a pipeline stage is filled with partial=True"):
        modelinit.init_module_(parts, seed=SEED)
    assert all(bool((p == 7.0).all()) for part in parts for p in part.parameters())
    with pytest.raises(ValueError, match=r"^module: an empty list of model parts"):
        modelinit.init_module_([], seed=SEED)
    with torch.device("meta"):
        other = dataclasses.replace(titan_config(), layers=titan_config().layers[:2]).build()
    other = _split_module(other, _generate_llm_fqn_per_model_part(2, 2)[1]).to_empty(device="cpu")
    with pytest.raises(ValueError, match=r"^module: model part 1 \(LlamaForCausalLM\) is not a part of the same model "
                                         r"as part 0"):
        modelinit.init_module_([parts[0], other], seed=SEED, partial=True)


def _ac(kind: str):
    """torchtitan's own activation checkpointing policy, as its parallelize functions build it."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return {"full": FullAC, "selective": SelectiveAC}[kind].Config().build(dump_folder="")


def _compile(model) -> None:
    """torchtitan's own per-block ``torch.compile`` (lazy: nothing compiles before a forward)."""
    from torchtitan.config.configs import CompileConfig
    from torchtitan.distributed.compile import apply_compile

    apply_compile(model, compile_config=CompileConfig(enable=True, components=["model"]),
                  parallel_dims=types.SimpleNamespace(tp_enabled=False))


@pytest.mark.parametrize("wrap", ["full_ac", "selective_ac", "compile", "selective_ac+compile", "compile_whole"])
def test_activation_checkpointing_and_compile_wrappers_get_the_unwrapped_bytes(reference, wrap):
    """torchtitan's ``FullAC``/``SelectiveAC`` (each block in torch's ``CheckpointWrapper``: names
    gain ``_checkpoint_wrapped_module``) and its ``apply_compile`` (each block compiled in place), in
    the order its parallelize functions apply them, and a ``torch.compile`` of the whole model: the
    same bytes as the unwrapped model, under the model's own names."""
    model = meta_model()
    if "ac" in wrap:
        _ac(wrap.split("_")[0]).apply(model)
        assert "_checkpoint_wrapped_module" in next(n for n, _ in model.named_parameters() if n.startswith("layers."))
    if wrap.endswith("compile"):
        _compile(model)
    model.to_empty(device="cpu")
    target = torch.compile(model) if wrap == "compile_whole" else model
    summary = modelinit.init_module_(target, seed=SEED)
    got = {n.replace("._checkpoint_wrapped_module", ""): p.detach() for n, p in model.named_parameters()}
    assert sorted(got) == sorted(reference)
    assert [n for n in got if not same_bytes(got[n], reference[n])] == []
    assert summary.tensors == len(got) and summary.missing == 0
    assert all("_checkpoint_wrapped_module" not in n for n in summary.stack_buffers)


def test_a_checkpoint_wrapped_moe_reports_its_own_buffers_under_the_models_names():
    """Under torchtitan's ``FullAC`` an MoE's load-balancing bias (its own state, set by its own
    ``_init_self_buffers``) is reported under the model's name, as without the wrapper."""
    from torchtitan.models.qwen3 import model_registry

    config = model_registry("debugmodel_moe", attn_backend="flex").model
    with torch.device("meta"):
        model = dataclasses.replace(config, layers=config.layers[:1]).build()
    _ac("full").apply(model)
    model.to_empty(device="cpu")
    summary = modelinit.init_module_(model, seed=SEED)
    assert summary.stack_buffers == ("layers.0.moe.expert_bias_E",)
    assert not model.layers["0"]._checkpoint_wrapped_module.moe.expert_bias_E.any()

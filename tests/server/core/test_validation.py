"""Hypothesis: whatever a request holds, Plan answers OK or INVALID_ARGUMENT with a field-named
message, and the server keeps serving."""
import json

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

FIELDS = ("spec", "dtype", "max_shard_size", "policy", "seed")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
config_keys = st.sampled_from(["model_type", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "vocab_size",
                               "num_attention_heads", "n_head", "intermediate_size", "architectures", "pad_token_id",
                               "tie_word_embeddings", "num_key_value_heads", "initializer_range", "max_position_embeddings"])
configs = st.dictionaries(config_keys, json_values | st.sampled_from(["gpt2", "llama", "bert", "qwen2"]) | st.integers(1, 64), max_size=8)
specs = st.one_of(
    st.builds(lambda p: pb.ModelSpec(preset=p), st.text(max_size=20) | st.sampled_from(["gpt2", "bert-base-uncased"])),
    st.builds(lambda c: pb.ModelSpec(config_json=json.dumps(c)), configs),
    st.builds(lambda t: pb.ModelSpec(config_json=t), st.text(max_size=40)),
    st.just(pb.ModelSpec()),
)
requests = st.builds(
    pb.ModelRequest,
    spec=specs,
    policy=st.builds(pb.Policy, preset=st.sampled_from(["", "hf-default", "bert-tf", "gpt2", "megatron", "torchtitan-llama3",
                                                        "xavier", "kaiming", "small-init", "torch-trunc-normal", "x"])),
    seed=st.integers(0, 2**64 - 1),
    dtype=st.sampled_from(["", "float32", "bfloat16", "float16", "int8", "F32"]) | st.text(max_size=6),
    max_shard_size=st.sampled_from(["", "5GB", "1", "0", "-1", "1KiB"]) | st.text(max_size=8),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests)
def test_any_request_gets_ok_or_a_clear_invalid_argument(server_target, req):
    with grpc.insecure_channel(server_target) as ch:
        stub = pb_grpc.ModelInitStub(ch)
        try:
            plan = stub.Plan(pb.PlanRequest(request=req), timeout=60)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
            assert e.details().startswith(FIELDS), e.details()
        else:
            assert plan.total_params > 0 and plan.files


def test_request_options_are_defined_once_frozen_and_checked():
    """The request's options are one frozen dataclass: checked at construction (the field named),
    the CLI's request flags are its fields, and its message is what the client sends."""
    import dataclasses

    import pytest

    from modelinit.cli import REQUEST_FLAGS
    from modelinit.errors import ModelInitError as Refused
    from modelinit.request import RequestOptions, model_request

    options = RequestOptions(seed=7, dtype="bfloat16", max_shard_size="1GB", algorithm_version=1, architecture="GPT2Model")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 8  # type: ignore[misc]
    for bad, field in (({"seed": -1}, "seed"), ({"seed": True}, "seed"), ({"algorithm_version": 2**32}, "algorithm_version"),
                       ({"architecture": 3}, "architecture")):
        with pytest.raises(Refused) as e:
            RequestOptions(**bad)
        assert e.value.details.startswith(f"{field}:"), e.value.details
    assert set(REQUEST_FLAGS) == {f.name for f in dataclasses.fields(RequestOptions)}
    assert options.request("gpt2") == model_request("gpt2", **options.keywords())
    msg = options.request("gpt2")
    assert (msg.seed, msg.dtype, msg.max_shard_size, msg.algorithm_version, msg.spec.architecture) == (7, "bfloat16", "1GB", 1, "GPT2Model")

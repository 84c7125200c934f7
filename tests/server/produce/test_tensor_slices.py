"""Slices over the wire (Tensors RPC, Client.tensors): the bytes equal the same elements of the files."""
from __future__ import annotations

import grpc
import modelinit
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelinit_server.produce import tensor_slices as slices
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc
from safetensors import safe_open

from tests.support import TINY

LLAMA = TINY["llama"]
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
UP = "model.layers.0.mlp.up_proj.weight"  # [160, 64]
NORM = "model.layers.1.input_layernorm.weight"  # [64]


@pytest.fixture(scope="module")
def written(tmp_path_factory, server_target):
    """dtype -> {name: (shape, file bytes)} of init_model's files (sharded, over the server)."""
    out = {}
    with modelinit.Client(server_target) as c:
        for dtype in ITEMSIZE:
            folder = tmp_path_factory.mktemp(dtype)
            c.init_model(LLAMA, seed=5, dtype=dtype, max_shard_size="200KB", out_dir=folder)
            tensors = {}
            for path in sorted(folder.glob("*.safetensors")):
                with safe_open(path, "pt") as f:
                    for name in f.keys():
                        t = f.get_tensor(name)
                        tensors[name] = (tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            out[dtype] = tensors
    return out


def file_slice(written, dtype, name, dims=None) -> bytes:
    """The block's bytes cut from the file bytes with numpy slicing."""
    shape, data = written[dtype][name]
    a = np.frombuffer(data, np.uint8).reshape(*shape, ITEMSIZE[dtype])
    if dims is not None:
        a = a[tuple(slice(lo, hi) for lo, hi in dims)]
    return np.ascontiguousarray(a).tobytes()


CASES = [
    (UP, ((40, 90), (10, 30))),       # a middle block
    (UP, ((7, 8), (63, 64))),         # one element
    (UP, None),                        # the whole tensor
    (UP, ((0, 160), (5, 6))),         # one column: a run per row
    (UP, ((150, 160), (0, 64))),      # trailing whole dims: one run
    (NORM, ((3, 60),)),
    (UP, ((10, 10), (0, 64))),        # empty
]


@pytest.mark.parametrize("dtype", list(ITEMSIZE))
def test_remote_slices_equal_the_file_bytes(client, written, dtype):
    # One call per case (several slices of one tensor would share a dict key).
    for name, dims in CASES:
        got = client.tensors(LLAMA, seed=5, dtype=dtype, names=[name] if dims is None else None,
                             slices=None if dims is None else {name: dims}, as_="bytes")
        t = got[name]
        assert t.dtype == dtype
        assert t.shape == (written[dtype][name][0] if dims is None else tuple(b - a for a, b in dims))
        assert bytes(t.data) == file_slice(written, dtype, name, dims), (name, dims)


def test_as_numpy_and_torch(client, written):
    dims = ((40, 90), (10, 30))
    arr = client.tensors(LLAMA, seed=5, slices={UP: dims})[UP]
    assert arr.dtype == np.float32 and arr.shape == (50, 20)
    assert arr.tobytes() == file_slice(written, "float32", UP, dims)
    t = client.tensors(LLAMA, seed=5, dtype="bfloat16", slices={UP: dims}, as_="torch")[UP]
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (50, 20)
    assert t.contiguous().view(torch.uint8).numpy().tobytes() == file_slice(written, "bfloat16", UP, dims)
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(modelinit.ModelInitError, match="ml_dtypes") as e:
            client.tensors(LLAMA, seed=5, dtype="bfloat16", slices={UP: dims})
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "as_='bytes'" in e.value.details
    else:
        a = client.tensors(LLAMA, seed=5, dtype="bfloat16", slices={UP: dims})[UP]
        assert a.shape == (50, 20) and a.tobytes() == file_slice(written, "bfloat16", UP, dims)


def test_stock_stub_fetches_a_slice(server_target, written):
    req = modelinit.client.model_request(LLAMA, seed=5, dtype="float16")
    sel = pb.TensorSelection(name=UP, dims=[pb.SliceDim(start=1, stop=100), pb.SliceDim(start=2)])  # stop unset: to the end
    with grpc.insecure_channel(server_target) as ch:
        msgs = list(pb_grpc.ModelInitStub(ch).Tensors(pb.TensorsRequest(request=req, selections=[sel], chunk_size=1000)))
    begin = msgs[0].begin
    assert (begin.name, begin.dtype, list(begin.shape), list(begin.tensor_shape)) == (UP, "float16", [99, 62], [160, 64])
    assert [(d.start, d.stop) for d in begin.dims] == [(1, 100), (2, 64)] and begin.nbytes == 99 * 62 * 2
    assert all(len(m.data) <= 1000 for m in msgs[1:]) and len(msgs) > 2
    assert b"".join(m.data for m in msgs[1:]) == file_slice(written, "float16", UP, ((1, 100), (2, 64)))


def test_embedded_equals_remote(client):
    sel = {UP: ((17, 33), (9, 50)), NORM: ((0, 64),)}
    names = ["model.embed_tokens.weight"]
    remote = client.tensors(LLAMA, seed=11, dtype="bfloat16", names=names, slices=sel, as_="bytes")
    with modelinit.Client() as local:
        embedded = local.tensors(LLAMA, seed=11, dtype="bfloat16", names=names, slices=sel, as_="bytes")
    assert list(remote) == names + list(sel) and remote == embedded


def test_every_tensor_when_nothing_is_selected(client, written):
    got = client.tensors(LLAMA, seed=5, dtype="float16", as_="bytes")
    assert set(got) == set(written["float16"])
    assert all(bytes(t.data) == written["float16"][n][1] for n, t in got.items())


BAD = [
    ({UP: ((0, 161), (0, 64))}, "selections[0].dims[0].stop"),
    ({UP: ((0, 10), (0, 65))}, "selections[0].dims[1].stop"),
    ({UP: ((5, 4), (0, 64))}, "selections[0].dims[0].start"),
    ({UP: ((0, 10),)}, "selections[0].dims"),
    ({"no.such.weight": ((0, 1),)}, "selections[0].name"),
]


@pytest.mark.parametrize("embedded", [False, True], ids=["remote", "embedded"])
@pytest.mark.parametrize("sel, field", BAD, ids=[b[1] for b in BAD])
def test_bad_selection_is_invalid_argument_naming_the_field(client, sel, field, embedded):
    c = modelinit.Client() if embedded else client
    with pytest.raises(modelinit.ModelInitError) as e:
        c.tensors(LLAMA, seed=5, slices=sel)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details.startswith(field + ":"), e.value.details


def test_tied_name_and_chunk_size_and_client_side_checks(client, server_target):
    with pytest.raises(modelinit.ModelInitError) as e:
        client.tensors(TINY["qwen2"], seed=1, names=["lm_head.weight"])  # tied to the embedding
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "model.embed_tokens.weight" in e.value.details
    with pytest.raises(modelinit.ModelInitError, match=r"slices\['x'\]\[0\].start"):
        client.tensors(LLAMA, seed=5, slices={"x": ((-1, 3),)})
    with pytest.raises(modelinit.ModelInitError, match="as_"):
        client.tensors(LLAMA, seed=5, names=[UP], as_="jax")
    req = modelinit.client.model_request(LLAMA, seed=5)
    with grpc.insecure_channel(server_target) as ch:
        with pytest.raises(grpc.RpcError) as err:
            list(pb_grpc.ModelInitStub(ch).Tensors(pb.TensorsRequest(request=req, chunk_size=4 << 20)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("chunk_size:")


def _runs(shape, dims):
    return [(int(a), int(c)) for starts, counts in slices.runs(shape, dims) for a, c in zip(starts, counts)]


def test_runs_fold_trailing_whole_dims():
    assert _runs((4, 5), ((1, 3), (0, 5))) == [(5, 10)]
    assert _runs((4, 5), ((1, 3), (2, 4))) == [(7, 2), (12, 2)]
    assert _runs((2, 3, 4), ((0, 2), (1, 2), (0, 4))) == [(4, 4), (16, 4)]
    assert _runs((2, 3), ((0, 2), (0, 3))) == [(0, 6)]
    assert _runs((2, 3), ((1, 1), (0, 3))) == []


@pytest.mark.parametrize("segment", [2, 6, 14, 1000, 1 << 20])
def test_blocks_split_runs_across_buffers(segment):
    """Buffers cut runs anywhere (mid-run, at run ends, several runs per buffer): the bytes are the
    block of the whole tensor, whatever the buffer size."""
    from types import SimpleNamespace

    from modelinit_server.engine import Sampler, reference

    shape, dtype, key = (37, 23), "bfloat16", (4, 9)
    sampler = Sampler("normal", std=0.02)
    whole = np.frombuffer(reference.generate(sampler, key, 0, 37 * 23, dtype), np.uint16).reshape(shape)
    tensor = SimpleNamespace(spec=SimpleNamespace(shape=shape), sampler=sampler, key=key)
    plan = SimpleNamespace(request=SimpleNamespace(dtype=dtype))
    dims = ((3, 30), (5, 12))
    items = list(slices.blocks(plan, [slices.Selection(0, tensor, dims)], segment=segment))
    assert isinstance(items[0], slices.Selection)
    assert all(len(b) <= max(segment, 2) for b in items[1:])
    assert b"".join(b.tobytes() for b in items[1:]) == np.ascontiguousarray(whole[3:30, 5:12]).tobytes()


@st.composite
def blocks(draw):
    dims = []
    for n in (160, 64):
        a = draw(st.integers(0, n))
        dims.append((a, draw(st.integers(a, n))))
    return tuple(dims)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dims=blocks(), dtype=st.sampled_from(list(ITEMSIZE)))
def test_random_slices_equal_numpy_slicing_of_the_file(client, written, dims, dtype):
    got = client.tensors(LLAMA, seed=5, dtype=dtype, slices={UP: dims}, as_="bytes")[UP]
    assert bytes(got.data) == file_slice(written, dtype, UP, dims)


def test_small_segments_split_runs_exactly(written):
    # A segment smaller than a run: runs are split across buffers, the bytes are unchanged.
    from modelinit_server.core.planner import build_plan
    from modelinit_server.messages import request_from_pb

    msg = modelinit.client.model_request(LLAMA, seed=5, dtype="float32")
    plan = build_plan(request_from_pb(msg))
    request = pb.TensorsRequest(request=msg, selections=[pb.TensorSelection(name=UP, dims=[pb.SliceDim(start=3, stop=150),
                                                                                             pb.SliceDim(start=1, stop=60)])])
    parts = [b for b in slices.blocks(plan, slices.select(plan, request), segment=36) if isinstance(b, np.ndarray)]
    assert all(len(p) <= 36 for p in parts)
    assert b"".join(p.tobytes() for p in parts) == file_slice(written, "float32", UP, ((3, 150), (1, 60)))


# -- resuming a Tensors stream ---------------------------------------------------------------------


def _stream(target, request):
    """(begins, data per selection index) of one Tensors call with a stock stub."""
    begins, data = [], {}
    with grpc.insecure_channel(target) as ch:
        for msg in pb_grpc.ModelInitStub(ch).Tensors(request):
            if msg.WhichOneof("event") == "begin":
                begins.append(msg.begin)
                data[msg.begin.index] = b""
            else:
                data[begins[-1].index] += msg.data
    return begins, data


def test_start_and_offset_resume_inside_a_selection(server_target, written):
    """start/offset skip whole selections and any bytes of the first one sent (also inside an
    element); the restated TensorBegin says how many; the rest follows unchanged."""
    req = modelinit.client.model_request(LLAMA, seed=5)
    dims = ((40, 90), (10, 30))
    sels = [pb.TensorSelection(name=UP, dims=[pb.SliceDim(start=a, stop=b) for a, b in dims]),
            pb.TensorSelection(name=NORM)]
    whole = {0: file_slice(written, "float32", UP, dims), 1: file_slice(written, "float32", NORM)}
    for start, offset in [(0, 0), (0, 777), (0, 1), (0, len(whole[0])), (1, 6), (1, len(whole[1]))]:
        begins, data = _stream(server_target, pb.TensorsRequest(request=req, selections=sels, start=start,
                                                                offset=offset, chunk_size=1000))
        assert [b.index for b in begins] == list(range(start, 2))
        assert [b.offset for b in begins] == [offset] + [0] * (len(begins) - 1)
        assert begins[0].nbytes == len(whole[start])  # the whole block's size, as before
        assert data[start] == whole[start][offset:]
        assert all(data[i] == whole[i] for i in range(start + 1, 2))
    for start, offset, field in [(2, 0, "start"), (0, len(whole[0]) + 1, "offset"), (1, len(whole[1]) + 2, "offset")]:
        with pytest.raises(grpc.RpcError) as e:
            _stream(server_target, pb.TensorsRequest(request=req, selections=sels, start=start, offset=offset))
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE and e.value.details().startswith(f"{field}: ")
    # embedded: the same stream and the same refusal
    local = modelinit.Client()
    stream = list(local.source.tensors(pb.TensorsRequest(request=req, selections=sels, start=0, offset=777)))
    assert stream[0].begin.offset == 777 and b"".join(m.data for m in stream[1:] if m.HasField("data")) \
        == whole[0][777:] + whole[1]
    with pytest.raises(modelinit.ModelInitError) as e:
        local.source.tensors(pb.TensorsRequest(request=req, selections=sels, start=5))
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE


class Cutter(pb_grpc.ModelInitServicer):
    """Forwards Tensors to a real server, records each request's (start, offset), and fails the
    first ``cuts`` calls (UNAVAILABLE: a lost server) once ``after`` bytes of selection ``at`` are
    through, splitting a message there (the cut falls inside an element)."""

    def __init__(self, upstream: str, at: int, after: int, cuts: int = 1, restate: bool = True) -> None:
        self._channel = grpc.insecure_channel(upstream)
        self._stub = pb_grpc.ModelInitStub(self._channel)
        self.at, self.after, self.cuts, self.restate = at, after, cuts, restate
        self.asked: list[tuple[int, int]] = []

    def Plan(self, request, context):
        return self._stub.Plan(request)

    def Tensors(self, request, context):
        self.asked.append((request.start, request.offset))
        current, sent = None, 0
        for msg in self._stub.Tensors(request):
            if msg.WhichOneof("event") == "begin":
                current, sent = msg.begin.index, msg.begin.offset
                if not self.restate and len(self.asked) > 1:
                    msg.begin.offset += 2  # a broken server: restates another byte
                yield msg
                continue
            if current == self.at and self.cuts and sent + len(msg.data) > self.after:
                self.cuts -= 1
                yield pb.TensorsResponse(data=msg.data[: self.after - sent])
                context.abort(grpc.StatusCode.UNAVAILABLE, "lost on purpose")
            sent += len(msg.data)
            yield msg


FAST = modelinit.client.RetryPolicy(deadline=30, initial_backoff=0.01, max_backoff=0.05)


@pytest.mark.parametrize("cuts", [1, 3])
def test_a_lost_stream_resumes_where_it_stopped(server_target, hostile, written, cuts):
    cutter = Cutter(server_target, at=2, after=1001, cuts=cuts)  # 1001 bytes into the third selection (UP)
    dims = {UP: ((0, 160), (5, 40)), NORM: None}
    with modelinit.Client(hostile(cutter), retry=FAST) as c:
        got = c.tensors(LLAMA, seed=5, slices={UP: dims[UP]}, names=["model.embed_tokens.weight", NORM], as_="bytes")
    assert cutter.asked == [(0, 0)] + [(2, 1001)] * cuts  # names first, then the sliced ones
    assert bytes(got[UP].data) == file_slice(written, "float32", UP, dims[UP])
    assert bytes(got[NORM].data) == file_slice(written, "float32", NORM)
    assert bytes(got["model.embed_tokens.weight"].data) == file_slice(written, "float32", "model.embed_tokens.weight")


def test_a_resumed_stream_that_restates_another_byte_is_refused(server_target, hostile):
    cutter = Cutter(server_target, at=0, after=10, restate=False)
    with pytest.raises(modelinit.ModelInitError) as e, modelinit.Client(hostile(cutter), retry=FAST) as c:
        c.tensors(LLAMA, seed=5, names=[UP])
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "asked for selection 0 byte 10" in e.value.details

"""The net the sharded-model tests fill under (tests/support/distributed.py ``no_collectives``)
catches both kinds of collective in a world of one gloo process: a public ``torch.distributed``
call, and a functional collective (``torch.ops._c10d_functional``, what DTensor issues itself),
which no public name sees; a body that communicates nothing passes."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
d = pytest.importorskip("torch.distributed")

from tests.support.distributed import no_collectives  # noqa: E402

pytestmark = pytest.mark.skipif(not d.is_available() or not d.is_gloo_available(), reason="needs torch.distributed with gloo")


@pytest.fixture()
def world_of_one(tmp_path):
    d.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield d.group.WORLD
    d.destroy_process_group()


def test_a_public_collective_is_refused_at_once(world_of_one):
    with pytest.raises(AssertionError, match="must not communicate"), no_collectives():
        d.all_reduce(torch.ones(4))


def test_a_functional_collective_is_caught(world_of_one):
    import torch.distributed._functional_collectives as funcol

    with pytest.raises(AssertionError, match=r"must not communicate; it ran the collectives .*all_reduce"):
        with no_collectives():
            out = funcol.all_reduce(torch.ones(4), "sum", world_of_one)
            assert torch.equal(out.wait() if hasattr(out, "wait") else out, torch.ones(4))


def test_filling_without_communicating_passes(world_of_one):
    with no_collectives():
        torch.ones(4).add_(1)

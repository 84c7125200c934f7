"""A model too big to stream in one go, for the tests that interrupt a run (a killed server, a lost
replica, SIGTERM) and compare what the resumed run wrote with an uninterrupted one: ``MEDIUM``, its
uninterrupted embedded run ``reference`` (a module-scoped fixture, registered in tests/conftest.py),
and ``FAST_RETRY``, a retry policy that resumes quickly."""
from __future__ import annotations

import modelinit
import pytest
from modelinit.client import RetryPolicy

from tests.support import TINY, read_folder

#: ~99 MB of float32 in 16 MB shards: far more than a stream's buffers on both ends (~40 MB of
#: segments, gRPC windows and socket buffers), so a stream interrupted after 20 MB really is
#: interrupted; still quick to make.
MEDIUM = {**TINY["llama"], "vocab_size": 16384, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 4}
FAST_RETRY = RetryPolicy(deadline=60, initial_backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted embedded run every interrupted one must equal, byte for byte."""
    out = tmp_path_factory.mktemp("ref")
    modelinit.Client().init_model(MEDIUM, seed=7, out_dir=out, max_shard_size="16MB")
    return read_folder(out)

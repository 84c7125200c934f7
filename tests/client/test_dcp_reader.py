"""torch DCP's ``HuggingFaceStorageReader`` loading a checkpoint modelinit uploaded to S3, read
over fsspec (s3fs) from a real S3 server on loopback (tests/support/s3_server.py), single process on
CPU, no process group; the tensors equal ``safetensors.torch.load_file`` of a local folder
written with the same request.

The reader in torch 2.13 reads local paths only: it is a ``FileSystemReader`` (whose
``FileSystem`` is pathlib's) and opens every shard with ``safetensors.safe_open(filename)``, which
memory-maps a local file. So the shards the manifest lists are fetched through fsspec first (what
docs/object_storage.md shows), and the last test pins the limitation, so that a torch that reads
``s3://`` directly shows up here (then the docs' recipe can drop the copy).
"""
from __future__ import annotations

import json

import pytest

from tests.support import TINY
from tests.support.s3_server import KEYS

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("s3fs")
safetensors_torch = pytest.importorskip("safetensors.torch")
if not hasattr(dcp, "HuggingFaceStorageReader"):
    pytest.skip("this torch's DCP has no HuggingFaceStorageReader (torch >= 2.8)", allow_module_level=True)
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # no_dist=True says so

REQUEST = dict(seed=3, dtype="bfloat16", max_shard_size="100KB")


def s3fs_for(server):
    """An fsspec S3 filesystem on the test server: the endpoint and keys given explicitly (the
    AWS_* environment works too)."""
    import s3fs

    return s3fs.S3FileSystem(key=KEYS["AWS_ACCESS_KEY_ID"], secret=KEYS["AWS_SECRET_ACCESS_KEY"],
                             endpoint_url=server.endpoint, skip_instance_cache=True)


def test_dcp_loads_the_uploaded_checkpoint(s3_server, s3_bucket, embedded, tmp_path):
    url = f"s3://{s3_bucket}/llama"
    embedded.init_model(TINY["llama"], out_dir=url, **REQUEST)
    embedded.init_model(TINY["llama"], out_dir=tmp_path / "local", **REQUEST)

    # The shards the manifest lists (a prefix may hold other objects), fetched over fsspec.
    fs = s3fs_for(s3_server)
    prefix = url.removeprefix("s3://")
    manifest = json.loads(fs.cat_file(f"{prefix}/modelinit.json"))
    shards = [f["name"] for f in manifest["files"] if f["name"].endswith(".safetensors")]
    assert len(shards) > 1
    fs.get([f"{prefix}/{name}" for name in shards], str(tmp_path / "copy") + "/")

    expected = {}
    for name in shards:
        expected.update(safetensors_torch.load_file(tmp_path / "local" / name))
    state_dict = {k: torch.empty_like(v) for k, v in expected.items()}
    dcp.load(state_dict, storage_reader=dcp.HuggingFaceStorageReader(str(tmp_path / "copy")), no_dist=True)

    assert state_dict.keys() == expected.keys()
    for k, v in expected.items():
        assert state_dict[k].dtype == v.dtype == torch.bfloat16 and state_dict[k].shape == v.shape
        assert torch.equal(state_dict[k].view(torch.int16), v.view(torch.int16)), k  # bit for bit


def test_the_reader_takes_local_paths_only(s3_server, s3_bucket, embedded):
    """torch 2.13's reader turns ``s3://b/p`` into the local path ``s3:/b/p``."""
    url = f"s3://{s3_bucket}/gpt2"
    embedded.init_model(TINY["gpt2"], out_dir=url, **REQUEST)
    reader = dcp.HuggingFaceStorageReader(url)
    with pytest.raises(FileNotFoundError, match=f"'s3:/{s3_bucket}/gpt2'"):
        reader.read_metadata()  # lists the "folder" with os.listdir
    with pytest.raises(CheckpointException, match=f"No such file or directory: 's3:/{s3_bucket}/gpt2'"):
        dcp.load({}, storage_reader=reader, no_dist=True)

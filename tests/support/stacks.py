"""The training stacks ``init_module_`` maps (torchtitan), installed by the tests themselves.

torchtitan's distribution asks for its whole training environment (datasets, wandb, tensorboard),
and datasets caps fsspec below what s3fs here needs, so the ``test`` extra cannot hold it. What
importing its models and state-dict adapters needs is small: the extra holds ``tyro`` and
``spmd_types``, and :func:`torchtitan` installs the pinned torchtitan itself, without its
dependencies, into ``tests/.stacks`` (once, under a file lock) and puts it on the path: the
subprocesses of distributed tests inherit it (``PYTHONPATH``). It skips only when pip cannot
reach a package index and no copy is there.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import subprocess
import sys

import pytest

from tests.support.installer import pip_install

TORCHTITAN = "torchtitan==0.3.0"
"""The release the tests run against (what docs/training.md names)."""
HERE = pathlib.Path(__file__).resolve().parents[1] / ".stacks"


def _on_path() -> None:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])


def install_torchtitan():
    """The torchtitan module, installed into tests/.stacks first when it is not importable. Skips where
    the models do not import because this torch lacks a name they take from it (torchtitan 0.3.0 imports
    ``torch.distributed.fsdp.DataParallelMeshDims``, which torch 2.11 has not: the GPU image of
    2026-11-28); any other import error fails."""
    try:
        import torchtitan  # noqa: F401 - installed by the caller's environment
        return sys.modules["torchtitan"]
    except ImportError:
        pass
    install_torchtitan_files()
    _on_path()
    try:
        import torchtitan.models.llama3  # noqa: F401 - the tests' models import torch.distributed's newer names
    except ImportError as e:
        if not names_torch(e):
            raise
        import torch

        pytest.skip(f"{TORCHTITAN} does not import with torch {torch.__version__} (too old for it): {e}")
    return sys.modules["torchtitan"]


def names_torch(error: ImportError) -> bool:
    """Whether an import error is torch's (a module or a name torch lacks), not the stack's own."""
    return (error.name or "").split(".")[0] == "torch" or " from 'torch" in str(error)


def install_torchtitan_files() -> None:
    """torchtitan's files in tests/.stacks (uv or pip, once, under a file lock), not imported: what the run's
    background install makes (tests/support/installs.py)."""
    pytest.importorskip("triton", reason="torchtitan imports triton (the test extra holds it on Linux)")
    pytest.importorskip("tyro", reason="torchtitan's config imports tyro (the test extra holds it)")
    HERE.mkdir(exist_ok=True)
    with open(HERE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it: wait for it
        if not (HERE / "torchtitan").is_dir():
            done = subprocess.run(pip_install("--quiet", "--no-deps", "--target", str(HERE), TORCHTITAN),
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.skip(f"cannot install {TORCHTITAN}: {(done.stdout + done.stderr)[-500:]}")



MEGATRON_NEWEST = "megatron-core==0.19.2"
"""The newest Megatron-Core, which the Megatron tests also run against (test_megatron_releases.py) beside
the test extra's pinned 0.16.1. 0.17 and later declare Python >= 3.12; their code is pure Python and
runs on 3.11, so it is installed from its sdist with pip's --ignore-requires-python (uv has no such
switch), without dependencies, into a folder of its own that only that run puts first on the path."""
MEGATRON_NEWEST_HERE = HERE.parent / ".stacks-megatron"


def install_newest_megatron() -> pathlib.Path:
    """The folder holding :data:`MEGATRON_NEWEST` (installed with pip once, under a file lock)."""
    MEGATRON_NEWEST_HERE.mkdir(exist_ok=True)
    with open(MEGATRON_NEWEST_HERE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (MEGATRON_NEWEST_HERE / "megatron" / "core").is_dir():
            done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                                   "--ignore-requires-python", "--target", str(MEGATRON_NEWEST_HERE), MEGATRON_NEWEST],
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.skip(f"cannot install {MEGATRON_NEWEST}: {(done.stdout + done.stderr)[-500:]}")
    return MEGATRON_NEWEST_HERE


MUP = ("mup==1.0.0", "pandas==3.1.1", "pytz==2026.6", "tzdata==2026.6")
"""microsoft/mup, the µP reference the mup preset and the coordinate check are compared with, and
what its ``coord_check`` imports (pandas): pinned. mup is an sdist whose declared dependencies
(torchvision, seaborn) would replace the CPU torch, so the test extra cannot hold it; installed
without dependencies like torchtitan (numpy, torch and dateutil are the test extra's)."""


def install_mup():
    """The mup module, installed with pandas into tests/.stacks first when it is not importable."""
    try:
        import mup  # noqa: F401 - installed by the caller's environment
        import pandas  # noqa: F401
        return sys.modules["mup"]
    except ImportError:
        pass
    HERE.mkdir(exist_ok=True)
    with open(HERE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((HERE / name).is_dir() for name in ("mup", "pandas", "pytz", "tzdata")):
            done = subprocess.run(pip_install("--quiet", "--no-deps", "--target", str(HERE), *MUP),
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.skip(f"cannot install {' '.join(MUP)}: {(done.stdout + done.stderr)[-500:]}")
    _on_path()
    import mup

    return mup

#: The Hugging Face config of the torchtitan tests' model: torchtitan's own debugmodel flavor
#: (dim 256, 16 heads, FFN 768, vocabulary 2048) cut to 2 layers, with 4 KV heads.
TORCHTITAN_HF = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
                 "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 768, "vocab_size": 2048,
                 "tie_word_embeddings": False, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5}

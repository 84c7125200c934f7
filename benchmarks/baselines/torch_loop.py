"""Baseline: the strongest plain PyTorch loop: for every tensor of the model,
``torch.empty(shape, dtype=bf16).normal_(0, 0.02)``, then ``safetensors.torch.save_file`` of the
whole dict. No policy, no determinism across devices: the floor a hand-written script reaches.

    python benchmarks/baselines/torch_loop.py [tinyllama-1.1b | path/to/config.json]
"""
import pathlib
import resource
import shutil
import sys
import tempfile
import time

import torch
from modelinit_server.architectures import from_config, from_preset
from safetensors.torch import save_file

torch.set_num_threads(2)
name = sys.argv[1] if len(sys.argv) > 1 else "tinyllama-1.1b"
spec = from_config(pathlib.Path(name).read_text()) if pathlib.Path(name).is_file() else from_preset(name)
out = tempfile.mkdtemp(prefix="torch-loop-")
generator = torch.Generator().manual_seed(0)
start = time.perf_counter()
tensors = {t.name: torch.empty(t.shape, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=generator) for t in spec.tensors}
drawn = time.perf_counter() - start
save_file(tensors, f"{out}/model.safetensors", metadata={"format": "pt"})
total = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(f"{name}: {spec.numel / 1e9:.3f}B params; draw {drawn:.1f}s; save {total - drawn:.1f}s; total {total:.2f}s; "
      f"peak RSS {peak:.1f} GB")
shutil.rmtree(out)

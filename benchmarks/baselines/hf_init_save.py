"""Baseline: what a user does today with transformers: build the model from its config, cast to
bf16, save_pretrained (safetensors). Prints one line with the total seconds and peak RSS.

    python benchmarks/baselines/hf_init_save.py [tinyllama-1.1b | path/to/config.json]
"""
import json
import pathlib
import resource
import shutil
import sys
import tempfile
import time

import torch
import transformers
from modelinit_server.architectures import PRESETS
from modelinit_server.architectures.meta_models import default_class

torch.set_num_threads(2)
name = sys.argv[1] if len(sys.argv) > 1 else "tinyllama-1.1b"
document = json.loads(pathlib.Path(name).read_text()) if pathlib.Path(name).is_file() else PRESETS[name]
config = transformers.AutoConfig.for_model(**document)
cls = getattr(transformers, (config.architectures or [default_class(config.model_type)])[0])
out = tempfile.mkdtemp(prefix="hf-init-save-")
torch.manual_seed(0)
start = time.perf_counter()
model = cls(config).to(torch.bfloat16)
built = time.perf_counter() - start
model.save_pretrained(out)
total = time.perf_counter() - start
params = sum(p.numel() for p in model.parameters())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(f"{name}: {params / 1e9:.3f}B params; build {built:.1f}s; save {total - built:.1f}s; total {total:.2f}s; "
      f"peak RSS {peak:.1f} GB")
shutil.rmtree(out)

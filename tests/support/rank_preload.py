"""What the fork server of :func:`tests.support.distributed.spawn` imports once, before it forks
any rank: torch, transformers, the stacks and the modules the ranks' bodies use, and the numba
kernels' machine code (compiled or loaded from numba's cache, never run: ``engine.cpu.load_serial``).

A module that cannot be imported here, for whatever reason (not installed, or a stack's release
that raises on import), is left for the rank that needs it to import, which then fails with the
real error in its test; the fork server itself must never fail, since every later world of this
test process would fail with it."""
from __future__ import annotations

import importlib
import warnings

#: In the order they are imported (Megatron-Core alone is about 4 s of a rank's start).
MODULES = ("torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp", "numpy", "safetensors",
           "transformers", "modelinit", "modelinit_server.training", "megatron.core", "megatron.core.models.gpt",
           "megatron.core.transformer.moe.experts", "torchtitan.models", "tests.support.megatron_models",
           "tests.support.torchtitan_models")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Megatron warns that Apex and Transformer Engine are absent
    for _name in MODULES:
        try:
            importlib.import_module(_name)
        except Exception:  # noqa: BLE001, S112 - see the module's docstring
            continue
    try:  # the numba kernels' machine code, inherited by every rank instead of loaded by each (~0.5 s apiece)
        from modelinit_server.engine import cpu

        if cpu.available():
            cpu.load_serial()
    except Exception:  # noqa: BLE001, S110 - a rank that fills loads them itself
        pass

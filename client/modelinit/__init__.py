"""modelinit: freshly initialized model weights from (architecture spec, init policy, seed).

    import modelinit
    with modelinit.Client() as client:            # embedded server; or Client("host:50051")
        result = client.init_model("bert-base-uncased", seed=42, out_dir="ckpt/")
    modelinit.reproduce("ckpt/", "ckpt-again/")   # the run recorded in ckpt/modelinit.json, byte for byte

The client is thin (no torch); the embedded server needs the ``server`` extra (docs/install.md).
In the training process, ``modelinit.init_module_(module, seed=42)`` fills a materialized (or
sharded) module with the same bytes (docs/training.md); it loads the server extra on first use.
``modelinit.probe(spec, policies=[...])`` measures what an init does to the signal and the
gradient on the real model before a run (docs/probe.md).
"""
from modelinit_wire.v1.modelinit_pb2 import (  # typed policy objects, e.g. Rule(match=Match(roles=["mlp_out"]), init=...)
    Constant,
    Distribution,
    FanScaled,
    Match,
    Normal,
    Policy,
    Rule,
    TruncNormal,
    Uniform,
)

from .client import Client, InitResult, reproduce
from .tensor_bytes import TensorBytes
from .probing import coord_check, probe
from .errors import ModelInitError

__all__ = [
    "Client", "InitResult", "TensorBytes", "ModelInitError", "reproduce", "init_module_", "probe", "coord_check",
    "Policy", "Rule", "Match", "Distribution", "Normal", "TruncNormal", "Uniform", "Constant", "FanScaled",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``init_module_`` on first use: it needs torch and the server extra, which ``import
    modelinit`` never loads."""
    if name == "init_module_":
        from .server_extra import init_module_

        return init_module_()
    raise AttributeError(f"module 'modelinit' has no attribute {name!r}")

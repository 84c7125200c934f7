"""modelinit: freshly initialized model weights from (architecture spec, init policy, seed).

    import modelinit
    with modelinit.Client() as client:            # embedded server; or Client("host:50051")
        result = client.init_model("bert-base-uncased", seed=42, out_dir="ckpt/")
    modelinit.reproduce("ckpt/", "ckpt-again/")   # the run recorded in ckpt/modelinit.json, byte for byte

The client is thin (no torch); the embedded server needs ``pip install modelinit[server]``.
"""
from .client import Client, InitResult, reproduce
from .errors import ModelInitError
from .v1.modelinit_pb2 import (  # typed policy objects, e.g. Rule(match=Match(roles=["mlp_out"]), init=...)
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

__all__ = [
    "Client", "InitResult", "ModelInitError", "reproduce",
    "Policy", "Rule", "Match", "Distribution", "Normal", "TruncNormal", "Uniform", "Constant", "FanScaled",
]
__version__ = "0.1.0"

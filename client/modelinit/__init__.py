"""modelinit: freshly initialized model weights from (architecture spec, init policy, seed).

    import modelinit
    with modelinit.Client() as client:            # embedded server; or Client("host:50051")
        result = client.init_model("bert-base-uncased", seed=42, out_dir="ckpt/")

The client is thin (no torch); the embedded server needs ``pip install modelinit[server]``.
"""
from .client import Client, InitResult
from .errors import ModelInitError

__all__ = ["Client", "InitResult", "ModelInitError"]
__version__ = "0.1.0"

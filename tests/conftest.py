"""Shared fixtures: a real in-process server on a free port, the real client, tiny configs."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import modelinit
from modelinit_server.server import EmbeddedServer

REPO = pathlib.Path(__file__).resolve().parents[1]

#: Tiny configs of every supported family: fast to generate, still every tensor kind and role.
TINY = {
    "bert": {"model_type": "bert", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "max_position_embeddings": 128, "type_vocab_size": 2, "pad_token_id": 0},
    "roberta": {"model_type": "roberta", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 128, "max_position_embeddings": 130, "type_vocab_size": 1, "pad_token_id": 1,
                "bos_token_id": 0, "eos_token_id": 2},
    "gpt2": {"model_type": "gpt2", "vocab_size": 1000, "n_embd": 64, "n_layer": 3, "n_head": 4, "n_positions": 128},
    "llama": {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": True},
}


@pytest.fixture(scope="session")
def server_target():
    server = EmbeddedServer()
    yield server.target
    server.stop()


@pytest.fixture()
def client(server_target):
    with modelinit.Client(server_target) as c:
        yield c


def read_folder(path: pathlib.Path) -> dict[str, bytes]:
    """Every file of an output folder (hidden temp files included, so leftovers show up)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


class ServerProcess:
    """`modelinit serve` in a subprocess on a free loopback port."""

    def __init__(self, *extra: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "modelinit.cli", "serve", "--host", "127.0.0.1", "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        line = self.proc.stdout.readline()
        self.ready_line = line
        m = re.search(r":(\d+) ", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.target = f"127.0.0.1:{m.group(1)}"

    def peak_rss_bytes(self) -> int:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc.kill()


@pytest.fixture()
def server_process():
    procs = []

    def start(*extra: str) -> ServerProcess:
        procs.append(ServerProcess(*extra))
        return procs[-1]

    yield start
    for p in procs:
        p.stop()

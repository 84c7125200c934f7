"""The fuzz targets (fuzz/README.md) in CI: a short, bounded smoke of every target.

Each target replays its whole corpus (seeds, and the regression inputs of fixed findings) and a fixed
set of mutations of it (bits flipped, bytes cut, inserted and repeated: deterministic, so a failure
reproduces), each input under the target's contract and a deadline; the campaign runner (atheris)
runs one cheap target for a few thousand executions, proving the long campaign's machinery works.
The long campaign itself is ``python -m fuzz.run --all`` (its figures are in fuzz/README.md)."""
from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys

import pytest

from tests.support import REPO

from fuzz import seeds
from fuzz.run import CORPUS
from fuzz.targets import TARGETS
#: Mutations per corpus file in the smoke (the folder target is about 50 ms an input, the others under 10).
MUTATIONS = {"folder": 12, "request": 40, "config": 40}
DEFAULT_MUTATIONS = 150
#: Seconds one input may take before it counts as a hang (the first input of a model type imports its module).
DEADLINE = 30


def _mutations(data: bytes, rng: random.Random, n: int):
    for _ in range(n):
        b = bytearray(data)
        for _ in range(1 + rng.randrange(4)):
            op = rng.randrange(5)
            at = rng.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(at, len(b) - 1)] ^= 1 << rng.randrange(8)
            elif op == 1:
                del b[at:at + rng.randrange(1, 64)]
            elif op == 2:
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
            elif op == 3:
                b[at:at] = b[at:at + 32] * rng.randrange(1, 8)
            else:
                b[at:at + 1] = rng.choice([b"\x00", b"\xff", b"[", b"{", b'"', b"-1", b"1e999", b"\n"])
        yield bytes(b)


@contextlib.contextmanager
def _deadline(seconds: int, what: str):
    def hang(*_):
        raise TimeoutError(f"{what}: over {seconds} s (a hang is a finding)")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_every_target_has_a_corpus_and_a_row_in_the_readme():
    readme = (REPO / "fuzz" / "README.md").read_text()
    for name in TARGETS:
        assert any((CORPUS / name).glob("seed-*")), f"fuzz/corpus/{name} has no seed"
        assert f"| `{name}` |" in readme, f"fuzz/README.md has no row for {name}"
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(TARGETS)


def test_the_corpus_is_what_the_seed_script_writes():
    for target, files in {**seeds.seeds()}.items():
        for name, data in files.items():
            assert (CORPUS / target / f"seed-{name}").read_bytes() == data, f"run python -m fuzz.seeds ({target}/{name})"
    for target, files in seeds.REGRESSIONS.items():
        for name, data in files.items():
            assert (CORPUS / target / f"regression-{name}").read_bytes() == data


@pytest.mark.parametrize("name", [n for n in TARGETS if n not in ("folder", "request", "config")])
def test_smoke(name):
    _smoke(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["folder", "request", "config"])
def test_smoke_of_the_slower_targets(name):
    _smoke(name)


def _smoke(name: str) -> None:
    target = TARGETS[name]
    target.setup()
    rng = random.Random(name)
    for path in sorted((CORPUS / name).iterdir()):
        data = path.read_bytes()
        for i, one in enumerate([data, *_mutations(data, rng, MUTATIONS.get(name, DEFAULT_MUTATIONS))]):
            with _deadline(DEADLINE, f"{name}/{path.name} mutation {i}"):
                try:
                    target.one(one[: target.max_len])
                except Exception as e:
                    raise AssertionError(f"{name}: {path.name}, mutation {i} ({one[:200]!r}) breaks the contract "
                                         f"({target.contract}): {type(e).__name__}: {e}") from e


@pytest.mark.slow
def test_the_campaign_runner_fuzzes_with_coverage(tmp_path):
    pytest.importorskip("atheris")
    done = subprocess.run([sys.executable, "-m", "fuzz.run", "manifest", "--runs", "3000", "--work", str(tmp_path / "work"),
                           "--findings", str(tmp_path / "findings")], cwd=REPO, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "stat::number_of_executed_units: 3000" in log and " cov: " in log, log[-3000:]
    assert not list((tmp_path / "findings").glob("*")), log[-3000:]

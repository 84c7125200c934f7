"""What a target is, and the small reader that splits one fuzz input into the parts a target needs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Target:
    """One input that reaches modelinit from outside, and its contract."""

    name: str
    """Its name: the runner's argument and the corpus folder's."""
    contract: str
    """What it may do with any input: the allowed outcomes, in words (fuzz/README.md lists them)."""
    one: Callable[[bytes], None]
    """Hands one input to the project's code; returns on an allowed outcome, raises on a finding."""
    setup: Callable[[], None] = lambda: None
    """Made once per process before the first input (imports, a finished folder to damage)."""
    max_len: int = 4096
    """Longest input the campaign generates (libFuzzer's -max_len)."""


class Reader:
    """Takes the input apart front to back: small integers and choices from its first bytes, the
    rest as text or bytes, so a mutation of any byte changes one decision or the payload."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            return 0
        self.at += 1
        return self.data[self.at - 1]

    def int(self, n_bytes: int = 4) -> int:
        """An unsigned little-endian integer of ``n_bytes`` (missing bytes are 0)."""
        return sum(self.byte() << (8 * i) for i in range(n_bytes))

    def choice(self, options):
        return options[self.byte() % len(options)]

    def take(self, n: int) -> bytes:
        out = self.data[self.at:self.at + n]
        self.at += len(out)
        return out

    def rest(self) -> bytes:
        out = self.data[self.at:]
        self.at = len(self.data)
        return out

    def text(self) -> str:
        """The rest as UTF-8 (undecodable bytes replaced: the targets that read files see raw bytes)."""
        return self.rest().decode("utf-8", "replace")

"""What a stream of file events (Begin, Data..., End per file) holds, gathered for comparison."""
from __future__ import annotations

from modelinit_wire.events import Begin, Data, End


def collect(source) -> tuple[dict[int, bytes], dict[int, str | None]]:
    """Each file's bytes and its End's SHA-256, by plan index."""
    data: dict[int, bytes] = {}
    ends: dict[int, str | None] = {}
    cur = None
    for ev in source:
        if isinstance(ev, Begin):
            cur = ev.index
            data[cur] = b""
        elif isinstance(ev, Data):
            data[cur] += bytes(ev.data)  # copy now: with a ring the buffer is reused later
        else:
            assert isinstance(ev, End)
            ends[ev.index] = ev.sha256
    return data, ends

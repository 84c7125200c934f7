"""The progress display of a long write or check: a tqdm bar on stderr, a caller's callable, or nothing."""
from __future__ import annotations

from typing import Callable


def progress_bar(progress: bool | Callable[[int], None], total: int) -> Callable[[int | None], None]:
    """``progress``: True -> a tqdm bar on stderr; a callable gets byte counts; False -> nothing.
    The returned function takes a byte count, or None to close."""
    if callable(progress):
        return lambda n: None if n is None else progress(n)
    if not progress:
        return lambda n: None
    from tqdm import tqdm

    # Decimal units (kB, MB, GB), as the summary line and --max-shard-size's "5GB" count them.
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="modelinit", leave=False)
    return lambda n: bar.close() if n is None else bar.update(n)

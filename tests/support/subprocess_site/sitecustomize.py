"""Run first by every Python process the tests start: tests/conftest.py puts this folder on
PYTHONPATH, so Python's ``site`` imports this module at each interpreter's start (a process that
sets its own PYTHONPATH, or runs with ``-I`` or ``-E``, goes without it).

It sets the garbage collector's thresholds to the console script's
(``modelinit.cli.entry.GC_THRESHOLDS``, which says why; tests/project/test_suite_tools.py checks
the two agree): the docs' blocks, the benchmarks and the ``python -c`` children import torch and
transformers, and at CPython's default (700, 10, 10) a tenth to a fifth of such a process's CPU
went to about a thousand collections that find almost nothing. Nothing else: no import beyond
``gc``, so a test that counts what a fresh interpreter imports sees the same."""
import gc

gc.set_threshold(20_000, 20, 50)

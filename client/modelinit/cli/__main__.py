"""``python -m modelinit.cli``: the console script."""
from modelinit.cli.entry import run

run()

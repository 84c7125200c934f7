"""Coverage-guided fuzzing of every input that reaches modelinit from outside (fuzz/README.md):
the targets and their contracts (``fuzz.targets``), the campaign runner (``python -m fuzz.run``),
and a seed corpus per target (``fuzz/corpus/TARGET``)."""

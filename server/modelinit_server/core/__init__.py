"""The core: from a request to a plan, with no weights generated and no transport.

    tensors    ModelSpec / TensorSpec: what a model is made of (kinds, roles, fans)
    policies/  init policies as data: rules, presets, resolution to engine samplers, formulas
    variance_scaling  the one fan-based std/bound primitive (Xavier, LeCun, Kaiming) and the
               nonlinearity gains; the architectures' recorder uses it too
    planner    Request -> Plan: every tensor resolved, keyed, placed in a shard; the fingerprint
    layout     shard packing, safetensors headers, the HF JSON files
    explain    a plan's tensor groups against the Xavier/LeCun stds, with warnings

May import: the engine (samplers, dtypes, keys) and modelinit_wire.constants. Not grpc, not the
architectures (they import ``core.tensors``), nothing above (pyproject.toml's contracts).
"""

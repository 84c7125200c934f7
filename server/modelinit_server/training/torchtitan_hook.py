"""modelinit turned on from torchtitan's own configuration, without editing its trainer:

    torchrun --nproc-per-node 8 -m torchtitan.train --module llama3 --config llama3_8b \\
        --override.imports 'modelinit_server.training.torchtitan_hook.modelinit_init={"seed": 42}'

torchtitan 0.3's trainer builds the model on the meta device, parallelizes it (or splits it into
pipeline stages, each a deep copy), materializes it (``to_empty``) and calls each part's
``init_weights``, whose ``init_states`` calls ``param_init[name](param)`` for every parameter of
every module whose config sets ``param_init`` (``torchtitan/protocols/module.py``). Its override
mechanism (``torchtitan/config/override.py``) imports ``module.function`` targets listed in
``--override.imports`` and calls each ``@override`` factory on the config nodes it claims, with
the entry's JSON kwargs, before anything is built; the factory's return value replaces the node.

``modelinit_init`` claims the model's config (the top ``Module.Config`` of the tree) and sets,
in place, on every module config under it, a ``param_init`` whose entry for each of the module's
parameters fills that parameter (a DTensor: this rank's shard of it) with the bytes of the Hugging
Face folder ``modelinit init`` writes for the model's config, exactly as ``init_module_`` fills
the whole model (``ParameterFill``). Buffers (RoPE tables, MoE counters) stay torchtitan's
own ``_init_self_buffers``. The entry's kwargs: ``seed`` (required), ``spec`` (a preset name, a
config.json path, or the config as a dict; left out, derived from the model's own config as
``init_module_`` derives it), ``policy`` (a preset name or a policy file's path; default
hf-default).

torchtitan is imported here at import time: this module is imported by torchtitan itself (its
docstrings cite no name for the docs' cross references to import)."""
from __future__ import annotations

import copy
from typing import Any

from torchtitan.config.override import override
from torchtitan.protocols.module import Module

from ..core.planner import Request
from ..engine import ALGORITHM_VERSION
from .init import policy_of
from .job import Job, Shared, fill
from .modules import dtype_name, module_tensors
from .torchtitan_layout import STACK, is_torchtitan_model


class ParameterFill:
    """The whole model's layout and plan, worked out once (``prepare``, from a twin of the model
    built on the meta device from its config), and the fill of one named parameter."""

    def __init__(self, config, seed: int, spec: Any = None, policy: Any = None, device: str = "auto") -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"modelinit_init: seed is {seed!r}; give a non-negative integer, e.g. "
                             "--override.imports 'modelinit_server.training.torchtitan_hook.modelinit_init={\"seed\": 42}'")
        self.config, self.seed, self.spec, self.device = config, seed, spec, device
        self.policy = policy_of(policy)  # a bad policy is refused here, before anything is built
        self._job: Job | None = None
        self._shared = Shared()

    def __deepcopy__(self, memo) -> "ParameterFill":
        return self  # torchtitan's pipeline split deep-copies the model: its stages share the one plan

    def prepare(self, twin=None) -> None:
        """Work out the whole model's layout from ``twin`` (the model built on the meta device from its
        config; built here when not given): the spec derived or read, every parameter placed, or the
        refusal, before any parameter is written. Each dtype's plan is made as it is met."""
        import torch

        if twin is None:
            with torch.device("meta"):
                twin = self.config.build()
        with torch.device("cpu"):  # the layout's index probes are real tensors, whatever device the caller set
            derived = STACK.own_config(twin) if self.spec is None else None
            given = self._shared.read(self.spec if derived is None else derived)
            named = [(n, t) for n, _, t in module_tensors(twin) if t.is_floating_point()]
            layout = STACK.layout(twin, given, named, {n: r for n, r, _ in module_tensors(twin)}, False)
        self._job = Job(layout.spec, [], layout, {}, [], (), (), derived, ALGORITHM_VERSION)

    def __call__(self, name: str, param) -> None:
        if self._job is None:
            self.prepare()
        job = self._job
        if name not in job.layout.pieces:
            raise ValueError(f"modelinit_init: {name!r} is not a parameter of the model built from its config")
        if not job.layout.pieces[name]:
            return  # a tensor the Hugging Face layout does not hold: the stack's own state
        dt = dtype_name(param)
        if dt is None:
            raise ValueError(f"modelinit_init: {name!r} is {param.dtype}; modelinit generates float32, bfloat16, float16")
        if dt not in job.plans:
            job.plans[dt] = self._shared.plan(Request(model=job.spec, policy=self.policy, seed=self.seed, dtype=dt,
                                                      algorithm_version=job.version))
        one = Job(job.spec, [(name, param)], job.layout, {dt: job.plans[dt]}, [dt], (), (), job.derived, job.version)
        fill(one, self.device)


class _Param:
    """``param_init``'s entry for one parameter: its name in the whole model, and the fill."""

    def __init__(self, fill: ParameterFill, name: str) -> None:
        self.fill, self.name = fill, name

    def __call__(self, param) -> None:
        self.fill(self.name, param)

    def __deepcopy__(self, memo) -> "_Param":
        return self

    def __repr__(self) -> str:  # torchtitan logs its configs
        return f"modelinit({self.name})"


def _distinct(config) -> None:
    """Give each module config of the tree its own node: a node reached under two names (one config
    object listed twice) would carry one ``param_init`` for two modules; each repeat is replaced, in
    its parent, by a deep copy (``build()`` makes a module per reference either way)."""
    while True:
        seen: set[int] = set()
        for fqn, node, parent, attr in config.traverse(Module.Config, recurse=True):
            if id(node) not in seen:
                seen.add(id(node))
                continue
            twin = copy.deepcopy(node)
            if isinstance(parent, list):
                parent[attr] = twin
            else:
                setattr(parent, attr, twin)
            break
        else:
            return


@override(target=Module.Config, description="modelinit: every parameter filled with the bytes of the Hugging Face "
          "folder of the model's config, a function of the seed alone")
def modelinit_init(config, *, seed: int, spec: Any = None, policy: Any = None):
    """Set ``param_init`` on every module config of a torchtitan model's config (the node this override
    claims; any other top-level component is returned as it is), in place: see the module's docstring."""
    import torch

    owner = getattr(type(config), "_owner", None)
    if owner is None or not any(c.__module__.startswith("torchtitan.models.") for c in owner.__mro__):
        return config
    fill = ParameterFill(config, seed, spec, policy)
    _distinct(config)
    with torch.device("meta"):
        twin = config.build()
    if not is_torchtitan_model(twin):
        return config
    fill.prepare(twin)  # a spec the model does not match is refused now, before the trainer builds anything
    modules = dict(twin.named_modules())
    for fqn, node, _, _ in config.traverse(Module.Config, recurse=True):
        module = modules.get(fqn)
        if module is None:
            raise ValueError(f"modelinit_init: the config's {fqn!r} builds no module of that name in "
                             f"{type(twin).__name__}; modelinit names each parameter by its config's place")
        names = [n for n, _ in module.named_parameters(recurse=False)]
        if names:
            node.param_init = {n: _Param(fill, f"{fqn}.{n}" if fqn else n) for n in names}
    return config

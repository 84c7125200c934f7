"""Init policies as data: ordered rules that match tensors and give them a distribution.

A policy resolves every tensor of a model to exactly one engine
:class:`~modelinit_server.engine.sampler.Sampler`; a tensor that no rule matches is an error that
names it (never a silent default). Presets are ordinary rule lists built from the model (they
need its ``initializer_range`` and depth).

    rules       the rule language: Match, Distribution, Rule (validated), the depth divisor
    presets     PRESETS: hf-default, bert-tf, gpt2, megatron, torchtitan-llama3, xavier, ...
    policy      Policy (a preset and rules of one's own) and rules_for, its full rule list
    resolution  resolve(policy, model) -> a Resolved (engine sampler, stds, formula) per tensor
    formulas    the formula text explain shows beside each group
    truncation  the truncated normal's mass check and std factor (platform-exact)

Fan-based kinds (Xavier, Kaiming) use :mod:`modelinit_server.core.variance_scaling`. Everything
other modules import is re-exported here: import from ``modelinit_server.core.policies``.
"""
from __future__ import annotations

from .formulas import formula
from .policy import Policy, rules_for
from .presets import PRESETS
from .resolution import Resolved, resolve
from .rules import DEPTH_SCALINGS, DISTRIBUTIONS, MAX_GLOB_CHARS, MAX_MATCH_VALUES, MAX_RULE_NAME_CHARS, Distribution, Match, Rule
from .truncation import truncated_std_factor

__all__ = [
    "DEPTH_SCALINGS", "DISTRIBUTIONS", "MAX_GLOB_CHARS", "MAX_MATCH_VALUES", "MAX_RULE_NAME_CHARS", "PRESETS",
    "Distribution", "Match", "Policy", "Resolved", "Rule", "formula", "resolve", "rules_for", "truncated_std_factor",
]

"""A :class:`Policy` (a preset, rules of one's own) and :func:`rules_for`, the full ordered rule
list it gives a model: its own rules, then its preset's."""
from __future__ import annotations

from dataclasses import dataclass

from modelinit_wire.quoting import quote

from ..tensors import ModelSpec
from .presets import PRESETS, RECORDED, has_recorded_rules
from .rules import Match, Rule


@dataclass(frozen=True)
class Policy:
    """A preset (optional) and rules of one's own, tried before the preset's."""

    preset: str = ""
    """Preset name (see :data:`PRESETS`); empty with no rules means ``hf-default``."""
    rules: tuple[Rule, ...] = ()
    """Rules tried first, in order."""

    def __post_init__(self) -> None:
        if self.preset and self.preset not in PRESETS:
            raise ValueError(f"policy.preset: unknown preset {quote(self.preset)}; use one of: {', '.join(PRESETS)}")

    @property
    def effective_preset(self) -> str:
        return self.preset or ("" if self.rules else "hf-default")


#: Presets other than hf-default leave tensors of kind ``other`` (ViT's cls_token, bare position
#: tables) to their recorded transformers rule, by this named rule, listed last.
_OTHER_RECORDED = Rule(Match(kinds=("other",)), RECORDED, name="other: hf-default")


def rules_for(policy: Policy, model: ModelSpec) -> list[Rule]:
    """The full ordered rule list: the policy's own, then its preset's."""
    rules = list(policy.rules)
    if policy.effective_preset:
        rules += PRESETS[policy.effective_preset](model)
        if policy.effective_preset != "hf-default" and has_recorded_rules(model):
            rules.append(_OTHER_RECORDED)
    return [r if r.name else Rule(r.match, r.init, r.depth_scaling, r.zero_padding_row, f"rule[{i}]") for i, r in enumerate(rules)]


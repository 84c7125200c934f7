"""What a training stack is to ``init_module_``: one interface, :class:`Stack`, and what each
returns, :class:`Layout`.

A stack recognizes its models (transformers, torchtitan, Megatron-Core, or any other module as
its own spec) and says, for one module, the spec whose bytes it is filled with and where each of
its tensors takes them from (pieces of the spec's stored tensors). ``init_module_`` asks the
stacks of ``stacks.STACKS`` in order and fills what the first that recognizes the module says;
the fill itself (plans, engines, DTensor shards) is the same for every stack.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ..core.tensors import ModelSpec
from .fill import Piece


def not_in_spec(holder: str, hf_name: str, spec: ModelSpec, hint: str = "") -> ValueError:
    """The error for a stored tensor a stack's model holds (``holder``: who holds it) that the
    spec given for the model does not have; ``hint``: which config would have it."""
    return ValueError(f"module: {holder} holds {hf_name!r}, which the spec ({spec.architecture}) does not have: give "
                      f"the Hugging Face config this model corresponds to (spec=...){hint}")


def lacking(spec: ModelSpec, held: set[int], allowed: bool, fix: str) -> int:
    """How many of ``spec``'s stored tensors are not in ``held`` (indices); unless ``allowed``
    (a pipeline stage, an expert rank), a ValueError naming the first of them and ``fix``."""
    count = len(spec.tensors) - len(held)
    if count and not allowed:
        absent = next(t.name for i, t in enumerate(spec.tensors) if i not in held)
        raise ValueError(f"module: it lacks {count} tensor(s) of the spec, e.g. {absent!r}{fix}")
    return count


class Run(NamedTuple):
    """A run of a tensor's local elements: ``first:end`` of the flat local tensor, viewed as ``shape``,
    hold the global indices ``sets`` (per dim of that view; None: all of it)."""

    first: int
    end: int
    shape: tuple[int, ...]
    sets: list


@dataclass(frozen=True)
class Placed:
    """Where a tensor's local elements sit in its global tensor: the global tensor's shape (as the
    pieces' boxes address it) and the runs of the local elements. One run over the whole local
    tensor for a plain shard (its shape the tensor's own, or the view a fused tensor is filled
    through); several where a shard enters and leaves experts (FSDP2's shard of a GroupedMLP weight)."""

    whole: tuple[int, ...]
    runs: tuple[Run, ...]


@dataclass(frozen=True)
class Layout:
    """A module as a stack lays it out: its spec and where each of its tensors' bytes are."""

    spec: ModelSpec
    """The spec the module is filled with the bytes of (``modelinit init`` of it writes them)."""
    pieces: dict[str, list[Piece]]
    """Module tensor name (without wrappers) -> the pieces of the spec's tensors it holds."""
    missing: int = 0
    """Stored tensors of the spec the module does not hold (a pipeline stage, an expert rank)."""
    placed: dict[str, Placed] = field(default_factory=dict)
    """Module tensors whose global place the stack knows and the tensor does not say itself (a
    shard that is not a DTensor, as Megatron's tensor parallel; a fused tensor laid out in memory as
    another shape, as GroupedMLP's weights; FSDP2's shard of one); every other tensor says its own
    (a DTensor's placements, or a whole tensor)."""
    own_state: frozenset[str] = frozenset()
    """Module tensors that are the stack's own state, set by :meth:`Stack.prepare` and left as
    they are (torchtitan: an MoE's load-balancing bias); they draw nothing."""


class Stack(Protocol):
    """A training stack's models, as ``init_module_`` fills them."""

    name: str
    """How messages name the stack (``torchtitan``, ``Megatron-Core``)."""
    takes_spec: bool
    """True: its models carry no Hugging Face config of their own, so ``init_module_`` is given
    the one each corresponds to (``spec=``) and fills it with that model's bytes. False: a
    ``spec`` given is refused (the model carries its own, or is its own spec)."""

    def recognizes(self, module: Any) -> bool:
        """Whether ``module`` (its wrappers removed) is one of this stack's models."""
        ...

    def own_config(self, module: Any) -> dict[str, Any] | None:
        """For a stack that takes a spec: the Hugging Face config document that corresponds to the
        model, derived from the model's own configuration where the mapping is exact (used when no
        ``spec`` is given). None: this stack derives none (a ``spec`` is then required).
        ``ValueError`` naming the model's field that has no Hugging Face counterpart."""
        ...

    def prepare(self, module: Any) -> tuple[str, ...]:
        """Run the stack's own init of what is not a weight (buffers that draw nothing) before the
        module's tensors are listed; the persistent buffers it set."""
        ...

    def layout(self, module: Any, spec: ModelSpec | None, named: list[tuple[str, Any]], real: dict[str, str],
               partial: bool) -> Layout:
        """The module's :class:`Layout`. ``named``: (name without wrappers, tensor) of every
        floating-point parameter and persistent buffer, tied names included; ``real``: each
        name's real one; ``partial``: the module may lack some of the spec's tensors (a pipeline
        stage). ``ValueError`` for a tensor the spec does not have, or one it lacks unless partial."""
        ...


class StackBase:
    """The defaults a :class:`Stack` shares: it takes no spec, derives no config and has no state of
    its own to prepare; a stack says ``name``, ``recognizes`` and ``layout``, and overrides the rest
    where it differs."""

    name = ""
    takes_spec = False

    def recognizes(self, module: Any) -> bool:
        raise NotImplementedError

    def own_config(self, module: Any) -> dict[str, Any] | None:
        return None

    def prepare(self, module: Any) -> tuple[str, ...]:
        return ()

    def layout(self, module: Any, spec: ModelSpec | None, named: list[tuple[str, Any]], real: dict[str, str],
               partial: bool) -> Layout:
        raise NotImplementedError

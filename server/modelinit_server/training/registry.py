"""The training stacks ``init_module_`` knows, in the order it asks them: the first that
recognizes a module lays it out. A new stack is a module with a :class:`~.stack.Stack` (its
``STACK``) and one line here; ``plain`` comes last, as it recognizes every module."""
from __future__ import annotations

from typing import Any

from . import hf_layout, megatron, plain, torchtitan_layout
from .stack import Stack

STACKS: tuple[Stack, ...] = (
    torchtitan_layout.STACK,
    megatron.STACK,
    hf_layout.STACK,
    plain.STACK,
)


def stack_of(module: Any) -> Stack:
    """The stack of ``module`` (its wrappers removed): the first of :data:`STACKS` to recognize it."""
    return next(stack for stack in STACKS if stack.recognizes(module))

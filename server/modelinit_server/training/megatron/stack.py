"""The Megatron-Core stack as ``init_module_`` asks it (:class:`~modelinit_server.training.stack.Stack`): recognition, the
derived config, the layout."""
from __future__ import annotations

from ..stack import Layout, StackBase
from .config import own_config
from .hybrid import is_hybrid_model
from .layout import megatron_layout
from .nemotron import is_nemotron_h, nemotron_h_config
from .refusals import check_modules


def is_megatron_model(module) -> bool:
    """Whether ``module`` is a Megatron-Core model (its class is defined in ``megatron.core``, or
    Megatron-FSDP's, in the ``megatron_fsdp`` package: refused by name, :func:`.refusals.refuse_megatron_fsdp`);
    its wrappers removed (``modules.unwrap``)."""
    return any(c.__module__.startswith(("megatron.core.", "megatron_fsdp.")) for c in type(module).__mro__)


class MegatronStack(StackBase):
    """A Megatron-Core model, filled with the bytes of the Hugging Face model it corresponds to."""

    name = "Megatron-Core"
    takes_spec = True

    def recognizes(self, module) -> bool:
        return is_megatron_model(module)

    def own_config(self, module) -> dict | None:
        check_modules(module)  # what is refused is refused by name, before any of its fields
        if is_hybrid_model(module) and is_nemotron_h(module):
            return nemotron_h_config(module)
        return own_config(module)

    def layout(self, module, spec, named, real, partial) -> Layout:
        return megatron_layout(module, spec, dict(named), partial)


STACK = MegatronStack()

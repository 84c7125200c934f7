"""The training stacks ``init_module_`` asks (``training.registry``): each is a ``Stack``, the
plain one comes last and recognizes anything, and a new stack is its module and one line in
``STACKS``: recognized, prepared, given the spec and laid out, with nothing else edited."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from modelinit_server.architectures import from_config, from_preset  # noqa: E402
from modelinit_server.training import init_module_, registry  # noqa: E402
from modelinit_server.training.plain import plain_spec  # noqa: E402
from modelinit_server.training.stack import Layout  # noqa: E402

SEED = 7


def test_each_stack_has_the_interface_and_plain_comes_last():
    names = [stack.name for stack in registry.STACKS]
    assert names == ["torchtitan", "Megatron-Core", "transformers", "plain"]
    for stack in registry.STACKS:
        assert isinstance(stack.takes_spec, bool)
        assert callable(stack.recognizes) and callable(stack.prepare) and callable(stack.layout)
    assert registry.STACKS[-1].recognizes(object())
    assert registry.stack_of(torch.nn.Linear(2, 2)).name == "plain"


class Counted(torch.nn.Module):
    """A model of a made-up stack: a weight, and a buffer the stack's own code sets."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4, bias=False)
        self.register_buffer("calls", torch.zeros(3))


class CountedStack:
    """A stack of one file: it takes a spec, sets its buffer, and lays the weight out as a plain
    module's (so the bytes are known), the buffer as its own state."""

    name = "counted"
    takes_spec = True

    def __init__(self, config=None):
        self.specs, self.config = [], config

    def own_config(self, module):
        return self.config

    def recognizes(self, module) -> bool:
        return isinstance(module, Counted)

    def prepare(self, module) -> tuple[str, ...]:
        module.calls.fill_(7.0)
        return ("calls",)

    def layout(self, module, spec, named, real, partial) -> Layout:
        self.specs.append(spec)
        weights = [(n, t) for n, t in named if n != "calls"]
        model_spec, pieces = plain_spec(module, weights, real)
        return Layout(model_spec, {**pieces, "calls": []}, own_state=frozenset({"calls"}))


def test_a_new_stack_is_one_line_in_the_registry(monkeypatch):
    stack = CountedStack()
    monkeypatch.setattr(registry, "STACKS", (stack, *registry.STACKS))

    with pytest.raises(ValueError, match=r"^spec: a counted model is filled with the bytes of the Hugging Face model"):
        init_module_(Counted(), seed=SEED)
    with pytest.raises(ValueError, match=r"is not a model of a training stack modelinit maps \(counted, torchtitan, Megatron-Core\)"):
        init_module_(torch.nn.Linear(8, 4), seed=SEED, spec="bert-base-uncased")

    model = Counted()
    summary = init_module_(model, seed=SEED, spec="bert-base-uncased")
    assert stack.specs == [from_preset("bert-base-uncased")]  # the spec argument, read as the server reads it
    assert summary.stack_buffers == ("calls",) and summary.tensors == 1
    assert torch.equal(model.calls, torch.full((3,), 7.0))  # the stack's own state, left as prepare set it

    plain = torch.nn.Module()
    plain.proj = torch.nn.Linear(8, 4, bias=False)
    init_module_(plain, seed=SEED)  # the same tensor as a plain module's: the same bytes
    assert torch.equal(model.proj.weight, plain.proj.weight)


def test_a_stack_that_derives_its_config_needs_no_spec(monkeypatch):
    config = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 16, "vocab_size": 10}
    stack = CountedStack(config)
    monkeypatch.setattr(registry, "STACKS", (stack, *registry.STACKS))
    summary = init_module_(Counted(), seed=SEED)
    assert stack.specs == [from_config(config)] and summary.derived_config == config
    given = init_module_(Counted(), seed=SEED, spec="bert-base-uncased")  # a spec given wins, and is not reported
    assert stack.specs[-1] == from_preset("bert-base-uncased") and given.derived_config is None


def test_a_stack_on_the_base_says_only_what_differs(monkeypatch):
    """StackBase holds the shared defaults (no spec taken, no config derived, nothing prepared): a stack
    on it says its name, what it recognizes and its layout; every registered stack is one."""
    from modelinit_server.training.stack import StackBase

    class Lone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 4, bias=False)

    class Minimal(StackBase):
        name = "minimal"

        def recognizes(self, module) -> bool:
            return isinstance(module, Lone)

        def layout(self, module, spec, named, real, partial) -> Layout:
            model_spec, pieces = plain_spec(module, named, real)
            return Layout(model_spec, pieces)

    assert all(isinstance(s, StackBase) for s in registry.STACKS)
    stack = Minimal()
    assert (stack.takes_spec, stack.own_config(Lone()), stack.prepare(Lone())) == (False, None, ())
    monkeypatch.setattr(registry, "STACKS", (stack, *registry.STACKS))
    model, plain = Lone(), torch.nn.Module()
    plain.proj = torch.nn.Linear(8, 4, bias=False)
    summary = init_module_(model, seed=SEED)
    init_module_(plain, seed=SEED)
    assert summary.tensors == 1 and summary.stack_buffers == () and torch.equal(model.proj.weight, plain.proj.weight)

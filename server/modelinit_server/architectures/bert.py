"""BERT and RoBERTa (transformers ``modeling_bert.py`` / ``modeling_roberta.py``).

Built-in classes (the fast path; any other class goes through transformers): ``BertForMaskedLM`` /
``RobertaForMaskedLM`` (encoder without pooler + MLM head), ``BertModel`` / ``RobertaModel``
(encoder with pooler) and ``BertForPreTraining`` (encoder with pooler, MLM and next-sentence heads).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.tensors import ModelSpec, TensorSpec
from ._family import Family
from ._fields import (
    divisible,
    fill,
    flag,
    init_range,
    layers,
    optional,
    padding_row,
    positive_real,
    probability,
    reject_true,
    size,
    text,
    token_id,
    token_ids,
)
from ._modules import assemble, embedding, linear, norm, output_bias

#: ``BertConfig`` fields and defaults (transformers 5.23).
BERT_SCHEMA = {
    "vocab_size": (30522, size),
    "hidden_size": (768, size),
    "num_hidden_layers": (12, layers),
    "num_attention_heads": (12, size),
    "intermediate_size": (3072, size),
    "hidden_act": ("gelu", text),
    "hidden_dropout_prob": (0.1, probability),
    "attention_probs_dropout_prob": (0.1, probability),
    "max_position_embeddings": (512, size),
    "type_vocab_size": (2, size),
    "initializer_range": (0.02, init_range),
    "layer_norm_eps": (1e-12, positive_real),
    "pad_token_id": (0, token_id),
    "use_cache": (True, flag),
    "classifier_dropout": (None, optional(probability)),
    "is_decoder": (False, flag),
    "add_cross_attention": (False, flag),
    "bos_token_id": (None, token_id),
    "eos_token_id": (None, token_ids),
    "tie_word_embeddings": (True, flag),
}

#: ``RobertaConfig``: BERT's fields with RoBERTa's vocabulary and special tokens.
ROBERTA_SCHEMA = {
    **BERT_SCHEMA,
    "vocab_size": (50265, size),
    "pad_token_id": (1, token_id),
    "bos_token_id": (0, token_id),
    "eos_token_id": (2, token_ids),
}


@dataclass(frozen=True)
class _Flavor:
    """What differs between BERT and RoBERTa."""

    model_type: str
    schema: dict
    prefix: str
    """Base-model attribute in the MLM class (``bert`` / ``roberta``)."""
    mlm: str
    base: str
    head: str
    """MLM head module path (``cls.predictions`` / ``lm_head``)."""
    head_dense: str
    head_norm: str
    pretraining: str
    """The pre-training class (MLM + next-sentence heads, encoder with pooler); empty if none."""
    roberta_positions: bool
    """RoBERTa gives its position table ``padding_idx=pad_token_id`` and registers it last."""


_BERT = _Flavor(
    model_type="bert",
    schema=BERT_SCHEMA,
    prefix="bert",
    mlm="BertForMaskedLM",
    base="BertModel",
    head="cls.predictions",
    head_dense="transform.dense",
    head_norm="transform.LayerNorm",
    pretraining="BertForPreTraining",
    roberta_positions=False,
)
_ROBERTA = _Flavor(
    model_type="roberta",
    schema=ROBERTA_SCHEMA,
    prefix="roberta",
    mlm="RobertaForMaskedLM",
    base="RobertaModel",
    head="lm_head",
    head_dense="dense",
    head_norm="layer_norm",
    pretraining="",
    roberta_positions=True,
)


def _embeddings(flavor: _Flavor, prefix: str, cfg: dict[str, Any]) -> list[TensorSpec]:
    """``BertEmbeddings`` / ``RobertaEmbeddings``."""
    h, pad, positions = cfg["hidden_size"], cfg["pad_token_id"], cfg["max_position_embeddings"]
    p = f"{prefix}embeddings"
    word = embedding(
        f"{p}.word_embeddings",
        cfg["vocab_size"],
        h,
        "token_embedding",
        padding_row("pad_token_id", pad, cfg["vocab_size"], "word_embeddings"),
    )
    token_type = embedding(f"{p}.token_type_embeddings", cfg["type_vocab_size"], h, "token_type_embedding")
    layer_norm = norm(f"{p}.LayerNorm", h, "embedding_norm")
    if not flavor.roberta_positions:
        position = embedding(f"{p}.position_embeddings", positions, h, "position_embedding")
        return word + position + token_type + layer_norm
    position_pad = padding_row("pad_token_id", pad, positions, "position_embeddings")
    position = embedding(f"{p}.position_embeddings", positions, h, "position_embedding", position_pad)
    return word + token_type + layer_norm + position


def _layer(prefix: str, i: int, h: int, inter: int) -> list[TensorSpec]:
    """One ``BertLayer``: self-attention with its post-norm, then the MLP with its post-norm."""
    p = f"{prefix}encoder.layer.{i}"
    return [
        *linear(f"{p}.attention.self.query", h, h, "qkv", i),
        *linear(f"{p}.attention.self.key", h, h, "qkv", i),
        *linear(f"{p}.attention.self.value", h, h, "qkv", i),
        *linear(f"{p}.attention.output.dense", h, h, "attn_out", i),
        *norm(f"{p}.attention.output.LayerNorm", h, "attn_norm", i),
        *linear(f"{p}.intermediate.dense", h, inter, "mlp_in", i),
        *linear(f"{p}.output.dense", inter, h, "mlp_out", i),
        *norm(f"{p}.output.LayerNorm", h, "mlp_norm", i),
    ]


def _encoder(flavor: _Flavor, prefix: str, cfg: dict[str, Any], pooler: bool) -> list[TensorSpec]:
    """``BertModel`` / ``RobertaModel`` (the MLM classes build it without the pooler)."""
    h = cfg["hidden_size"]
    tensors = _embeddings(flavor, prefix, cfg)
    for i in range(cfg["num_hidden_layers"]):
        tensors += _layer(prefix, i, h, cfg["intermediate_size"])
    if pooler:
        tensors += linear(f"{prefix}pooler.dense", h, h, "pooler")
    return tensors


def _mlm_head(flavor: _Flavor, cfg: dict[str, Any]) -> list[TensorSpec]:
    """``BertLMPredictionHead`` / ``RobertaLMHead``: the bare output bias is the module's own
    parameter, so ``state_dict()`` lists it before the submodules."""
    h, vocab, head = cfg["hidden_size"], cfg["vocab_size"], flavor.head
    return [
        *output_bias(f"{head}.bias", h, vocab),
        *linear(f"{head}.{flavor.head_dense}", h, h, "head_transform"),
        *norm(f"{head}.{flavor.head_norm}", h, "head_norm"),
        *linear(f"{head}.decoder", h, vocab, "lm_head"),
    ]


def _check(cfg: dict[str, Any]) -> None:
    divisible("hidden_size", cfg["hidden_size"], "num_attention_heads", cfg["num_attention_heads"])
    reject_true(cfg, "add_cross_attention", "cross-attention (encoder-decoder) layers are not supported")


def _builder(flavor: _Flavor):
    def build(document: dict[str, Any], architecture: str) -> ModelSpec:
        cfg = fill(document, flavor.schema)
        _check(cfg)
        if architecture == flavor.base:
            state_dict, tied, base_model_prefix = _encoder(flavor, "", cfg, pooler=True), {}, ""
        else:
            pretraining = architecture == flavor.pretraining
            state_dict = _encoder(flavor, f"{flavor.prefix}.", cfg, pooler=pretraining) + _mlm_head(flavor, cfg)
            if pretraining:  # BertPreTrainingHeads: the MLM head, then the next-sentence classifier
                state_dict += linear("cls.seq_relationship", cfg["hidden_size"], 2, "classifier")
            # HF `_tied_weights_keys`, applied only when tie_word_embeddings is true.
            tied = {
                f"{flavor.head}.decoder.weight": f"{flavor.prefix}.embeddings.word_embeddings.weight",
                f"{flavor.head}.decoder.bias": f"{flavor.head}.bias",
            } if cfg["tie_word_embeddings"] else {}
            base_model_prefix = flavor.prefix
        return assemble(
            family=flavor.model_type,
            architecture=architecture,
            config=cfg,
            state_dict=state_dict,
            tied=tied,
            n_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            base_model_prefix=base_model_prefix,
        )

    return build


FAMILIES = (
    Family("bert", (_BERT.mlm, _BERT.base, _BERT.pretraining), _builder(_BERT)),
    Family("roberta", (_ROBERTA.mlm, _ROBERTA.base), _builder(_ROBERTA)),
)

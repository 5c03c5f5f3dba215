"""Train the ground-truth toy model shipped in tests/toy/model/.

A 2-layer Llama (4 query heads over 2 KV heads, d_model 64) over a 64-symbol vocabulary
is trained on sequences of random symbols repeated twice. The only way to predict the
second copy is to copy, and a 2-layer model learns the textbook circuit for that:
a previous-token head in layer 0 composes with an induction head in layer 1
(Olsson et al. 2022). The script then checks that the circuit is there, by reading the
attention on held-out data, and saves the model and a word-level tokenizer in HF format.

    python tests/toy/train_toy.py            # about two minutes on 2 CPU cores

The test suite never retrains; it loads tests/toy/model/ and checks that headscope finds
the heads that this script found and recorded in tests/toy/model/ground_truth.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

OUT = Path(__file__).resolve().parent / "model"
N_SYMBOLS = 60  # ids 0..3 are special, 4..63 are symbols t0..t59
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
SEQ_LEN = 64  # BOS + filler + segment + filler + segment
SEED = 0


def make_batch(generator: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random symbols with one segment repeated at a random gap.

    The segment length and both copies' positions vary per row, so no fixed positional offset
    predicts the copy: the model has to match tokens. Returns the ids, the mask of predictable
    positions (second copy after its first token), and, for each position, where its earlier
    occurrence's successor sits (-1 where there is none).
    """
    ids = torch.randint(4, 4 + N_SYMBOLS, (batch, SEQ_LEN), generator=generator)
    ids[:, 0] = 1
    predictable = torch.zeros(batch, SEQ_LEN, dtype=torch.bool)
    source = torch.full((batch, SEQ_LEN), -1)
    for row in range(batch):
        length = int(torch.randint(8, 25, (1,), generator=generator))
        first = int(torch.randint(1, SEQ_LEN - 2 * length + 1, (1,), generator=generator))
        second = int(torch.randint(first + length, SEQ_LEN - length + 1, (1,), generator=generator))
        ids[row, second : second + length] = ids[row, first : first + length]
        predictable[row, second + 1 : second + length] = True
        source[row, second : second + length] = torch.arange(first + 1, first + length + 1)
    return ids, predictable, source


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"t{i}": 4 + i for i in range(N_SYMBOLS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=128,
    )


def main() -> None:
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=4 + N_SYMBOLS,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: heads 0,1 read KV 0; heads 2,3 read KV 1
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(SEED)
    steps = 1500
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    for step in range(steps):
        ids, predictable, _ = make_batch(generator, 64)
        logits = model(ids).logits
        # Only the second copy is predictable; train on it alone.
        mask = predictable[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1][mask], ids[:, 1:][mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss on second copy {loss.item():.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        ids, _, source = make_batch(torch.Generator().manual_seed(SEED + 1), 64)
        out = model(ids, output_attentions=True)
    # Read the circuit off held-out data: previous-token and induction score per head,
    # over the queries in the second copy.
    rows, queries = (source >= 0).nonzero(as_tuple=True)
    prev = {}
    ind = {}
    for layer, attn in enumerate(out.attentions):
        for head in range(config.num_attention_heads):
            a = attn[:, head]
            prev[(layer, head)] = a[rows, queries, queries - 1].mean().item()
            ind[(layer, head)] = a[rows, queries, source[rows, queries]].mean().item()
    prev_head = max(prev, key=prev.get)
    ind_head = max(ind, key=ind.get)
    print("previous-token:", {f"L{k[0]}H{k[1]}": round(v, 3) for k, v in prev.items()})
    print("induction:     ", {f"L{k[0]}H{k[1]}": round(v, 3) for k, v in ind.items()})
    assert prev[prev_head] > 0.5 and ind[ind_head] > 0.5, "training did not produce the circuit"

    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT)
    build_tokenizer().save_pretrained(OUT)
    truth = {
        "previous_token_head": list(prev_head),
        "previous_token_score": round(prev[prev_head], 4),
        "induction_head": list(ind_head),
        "induction_score": round(ind[ind_head], 4),
        "sequence_length": SEQ_LEN,
        "previous_token_scores": {f"L{k[0]}H{k[1]}": round(v, 4) for k, v in prev.items()},
        "induction_scores": {f"L{k[0]}H{k[1]}": round(v, 4) for k, v in ind.items()},
        "seed": SEED,
        "final_loss_second_copy": round(loss.item(), 4),
    }
    (OUT / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    print(json.dumps(truth, indent=2))


if __name__ == "__main__":
    main()

"""Train the ground-truth toy model shipped in tests/toy/model/, or a series of checkpoints.

A 2-layer Llama (4 query heads over 2 KV heads, d_model 64) over a 64-symbol vocabulary
is trained on sequences of random symbols repeated twice. The only way to predict the
second copy is to copy, and a 2-layer model learns the textbook circuit for that:
a previous-token head in layer 0 composes with an induction head in layer 1
(Olsson et al. 2022). The script then checks that the circuit is there, by reading the
attention on held-out data, and saves the model and a word-level tokenizer in HF format.

    python tests/toy/train_toy.py            # about two minutes on 2 CPU cores

The test suite never retrains; it loads tests/toy/model/ and checks that headscope finds
the heads that this script found and recorded in tests/toy/model/ground_truth.json.

With --out, the script instead saves a training run as checkpoints, to watch the circuit
form: the held-out loss on the second copy stays near chance (ln 60, about 4.1) for a while,
then falls within a few dozen steps as the induction heads appear (the phase change).

    python tests/toy/train_toy.py --out /tmp/toyckpt --checkpoints 8   # ~1-2 min, 1 thread

It trains 600 steps by default (--steps; 1500 reproduces the schedule of tests/toy/model/),
measures the model every few steps on the same held-out batch as the check above, and keeps
those snapshots in memory. It then picks N of them, the first and the last included, evenly
spaced on a scale that mixes log-step and the fraction of the held-out loss drop achieved, so
they are geometric away from the phase change and dense through it. Each is written as an HF
folder DIR/step-NNNNN (model and tokenizer, like tests/toy/model/; NNNNN is the training step),
atomically (built in a temporary folder in DIR, then renamed), and DIR/steps.json records,
per checkpoint: train_loss (mean training loss over the steps since the previous snapshot),
copy_loss (held-out next-token loss on the second copy's predictable positions),
induction_score / induction_head (the best head's mean attention from each second-copy token
to the position after its first occurrence), previous_token_score / previous_token_head, and
every head's scores. Other step-* folders already in DIR are left alone; steps.json lists
this run's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

OUT = Path(__file__).resolve().parent / "model"
N_SYMBOLS = 60  # ids 0..3 are special, 4..63 are symbols t0..t59
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
SEQ_LEN = 64  # BOS + filler + segment + filler + segment
SEED = 0
STEPS = 1500  # the shipped model's schedule
CHECKPOINT_STEPS = 600  # default with --out: the phase change comes at about a third of the run


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


def build_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
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
    return LlamaForCausalLM(config)


def second_copy_loss(logits: torch.Tensor, ids: torch.Tensor, predictable: torch.Tensor) -> torch.Tensor:
    # Only the second copy is predictable; train (and measure) on it alone.
    mask = predictable[:, 1:]
    return torch.nn.functional.cross_entropy(logits[:, :-1][mask], ids[:, 1:][mask])


def train(model: LlamaForCausalLM, steps: int, seed: int) -> Iterator[tuple[int, float]]:
    """Train in place, yielding (step, loss) after each update; step counts updates, from 1."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    for step in range(1, steps + 1):
        ids, predictable, _ = make_batch(generator, 64)
        loss = second_copy_loss(model(ids).logits, ids, predictable)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        yield step, loss.item()


def measure(model: LlamaForCausalLM, seed: int) -> dict:
    """The circuit on held-out data: previous-token and induction score per head, over the
    queries in the second copy, and the loss on the second copy's predictable positions."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        ids, predictable, source = make_batch(torch.Generator().manual_seed(seed + 1), 64)
        out = model(ids, output_attentions=True)
    model.train(was_training)
    rows, queries = (source >= 0).nonzero(as_tuple=True)
    prev = {}
    ind = {}
    for layer, attn in enumerate(out.attentions):
        for head in range(model.config.num_attention_heads):
            a = attn[:, head]
            prev[(layer, head)] = a[rows, queries, queries - 1].mean().item()
            ind[(layer, head)] = a[rows, queries, source[rows, queries]].mean().item()
    return {
        "prev": prev,
        "ind": ind,
        "copy_loss": second_copy_loss(out.logits, ids, predictable).item(),
    }


def head_name(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


def ship_model(steps: int, seed: int) -> None:
    """Train the toy, check the circuit and save it with ground_truth.json to tests/toy/model/."""
    model = build_model(seed)
    for step, loss in train(model, steps, seed):
        if (step - 1) % 100 == 0 or step == steps:
            print(f"step {step - 1:5d}  loss on second copy {loss:.4f}", flush=True)

    model.eval()
    m = measure(model, seed)
    prev, ind = m["prev"], m["ind"]
    prev_head = max(prev, key=prev.get)
    ind_head = max(ind, key=ind.get)
    print("previous-token:", {head_name(k): round(v, 3) for k, v in prev.items()})
    print("induction:     ", {head_name(k): round(v, 3) for k, v in ind.items()})
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
        "previous_token_scores": {head_name(k): round(v, 4) for k, v in prev.items()},
        "induction_scores": {head_name(k): round(v, 4) for k, v in ind.items()},
        "seed": seed,
        "final_loss_second_copy": round(loss, 4),
    }
    (OUT / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    print(json.dumps(truth, indent=2))


def snapshot_every(steps: int) -> int:
    """A round snapshot interval giving at least 50 snapshots (10 for 600 steps, 25 for 1500)."""
    return max(d for d in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500) if d <= max(1, steps // 50))


def pick_checkpoints(steps: list[int], copy_loss: list[float], n: int) -> list[int]:
    """Pick n of the snapshot steps, the first and the last included.

    Each snapshot is placed on a scale from 0 to 1 that averages its log-step and the fraction
    of the held-out loss drop achieved by then; the picks are the snapshots nearest to n evenly
    spaced points on that scale. Away from the phase change the scale follows log-step (geometric
    spacing); through it, it follows the loss (dense picks where the loss falls fast).
    """
    if n >= len(steps):
        return list(steps)
    span = math.log(steps[-1] / steps[0]) or 1.0
    scale = [math.log(s / steps[0]) / span for s in steps]
    best = list(accumulate(copy_loss, min))
    drop = copy_loss[0] - best[-1]
    if drop > 0:  # without any drop (no learning), log-step alone
        scale = [(x + (copy_loss[0] - b) / drop) / 2 for x, b in zip(scale, best, strict=True)]
    picked = {0, len(steps) - 1}
    for k in range(1, n - 1):
        target = k / (n - 1)
        free = [i for i in range(len(steps)) if i not in picked]
        picked.add(min(free, key=lambda i: (abs(scale[i] - target), i)))
    return [steps[i] for i in sorted(picked)]


def save_atomic(model: LlamaForCausalLM, out: Path, name: str) -> None:
    """Write model and tokenizer to out/name by way of a temporary folder in out."""
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}."))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the saved folder should read like any other
        model.save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        final = out / name
        if final.exists():  # swap it out, so that out/name is never a partial folder
            old = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}.old."))
            os.replace(final, old / name)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_checkpoints(out: Path, n: int, steps: int, seed: int) -> None:
    """Train, snapshotting every few steps, then save n snapshots spanning the phase change."""
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    every = snapshot_every(steps)
    model = build_model(seed)
    snapshots = {}  # step -> (state dict, record for steps.json)
    losses = []
    for step, loss in train(model, steps, seed):
        losses.append(loss)
        if step % every and step != steps:
            continue
        m = measure(model, seed)
        prev_head = max(m["prev"], key=m["prev"].get)
        ind_head = max(m["ind"], key=m["ind"].get)
        record = {
            "step": step,
            "train_loss": round(sum(losses) / len(losses), 4),
            "copy_loss": round(m["copy_loss"], 4),
            "induction_score": round(m["ind"][ind_head], 4),
            "induction_head": head_name(ind_head),
            "previous_token_score": round(m["prev"][prev_head], 4),
            "previous_token_head": head_name(prev_head),
            "induction_scores": {head_name(k): round(v, 4) for k, v in m["ind"].items()},
            "previous_token_scores": {head_name(k): round(v, 4) for k, v in m["prev"].items()},
        }
        snapshots[step] = ({k: v.detach().clone() for k, v in model.state_dict().items()}, record)
        losses = []
        print(
            f"step {step:5d}  train loss {record['train_loss']:.4f}  copy loss {record['copy_loss']:.4f}"
            f"  induction {record['induction_score']:.3f}  previous-token {record['previous_token_score']:.3f}",
            flush=True,
        )

    chosen = pick_checkpoints(list(snapshots), [r["copy_loss"] for _, r in snapshots.values()], n)
    records = []
    for step in chosen:
        state, record = snapshots[step]
        model.load_state_dict(state)
        name = f"step-{step:05d}"
        save_atomic(model, out, name)
        records.append({"name": name, **record})
    summary = {
        "seed": seed,
        "steps": steps,
        "snapshot_every": every,
        "sequence_length": SEQ_LEN,
        "checkpoints": records,
    }
    tmp = out / f".steps.json.{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / "steps.json")
    print(f"saved {len(chosen)} checkpoints to {out}: steps {chosen} ({time.monotonic() - start:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="save checkpoints here instead of tests/toy/model/")
    parser.add_argument(
        "--checkpoints", type=int, default=8, help="checkpoints to save with --out (default 8)"
    )
    parser.add_argument(
        "--steps", type=int, help=f"training steps (default {STEPS}, or {CHECKPOINT_STEPS} with --out)"
    )
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed for weights and data (default {SEED})")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, or 1 with --out)")
    args = parser.parse_args()
    if args.checkpoints < 2:
        parser.error("--checkpoints must be at least 2")
    if args.threads or args.out:
        # One thread is as fast for this tiny model and far faster when the cores are shared.
        torch.set_num_threads(args.threads or 1)
    if args.out is None:
        ship_model(args.steps or STEPS, args.seed)
    else:
        save_checkpoints(args.out, args.checkpoints, args.steps or CHECKPOINT_STEPS, args.seed)


if __name__ == "__main__":
    main()

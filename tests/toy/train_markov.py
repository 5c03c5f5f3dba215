"""Train a toy that shows the in-context-learning phase change, as a series of checkpoints.

A 2-layer attention-only Llama (2 heads per layer, d_model 32, the MLPs zeroed and frozen so
they add exactly 0) is trained on in-context Markov chains, after Edelman et al. 2024 ("The
Evolution of Statistical Induction Heads: In-Context Learning Markov Chains"). Each sequence is
BOS and then 100 states of its own random chain over K = 5 states (every row of the transition
matrix drawn from Dirichlet(1), a uniform first state); the states are the symbols t0..t4 of a
word-level tokenizer like train_toy's (which, like train_toy's, adds no BOS: the model is trained
with BOS first, as headscope's repeated-tokens protocol feeds it). Nothing fixed predicts the next
state: only the bigram statistics of the sequence so far do, and the way to read them is a
statistical induction head: a previous-token head in layer 0 composing with a layer-1 head that
attends to the tokens that followed earlier occurrences of the current token.

Training goes through the stages the paper describes. First the loss falls from ln 9 to about
ln 5 (uniform over the states) with a flat curve over positions; then to in-context unigram
statistics (counts of the states seen so far, which already make late positions a little easier);
then, around step 200-500 depending on the seed, the induction head forms within a few dozen
steps and the model switches to in-context bigram statistics: the held-out loss at late positions
drops well below that at early ones. The ICL score (Olsson et al. 2022) tracks this: the mean
held-out loss at the last 10 positions (chain positions 90-99, the 0-based index of the predicted
state) minus that at positions 4-8. It is about 0 at first, about -0.05 in the unigram stage and
about -0.15 to -0.2 after the phase change (the Bayes-optimal predictor, Laplace's rule on the
transitions seen so far, scores about -0.19; steps.json records its curve and the unigram one).

    python tests/toy/train_markov.py --out /tmp/markov --checkpoints 8   # ~50 s, 1 thread

It trains 600 steps (--steps) at batch 64, measures every 10 steps on 512 held-out chains (from
seed 1000003 + --seed, never a training seed), picks N snapshots with train_toy.pick_checkpoints
(dense where the ICL score falls, geometric elsewhere) and saves each with train_toy.save_atomic as
DIR/step-NNNNN (model and tokenizer). DIR/steps.json records, per checkpoint: train_loss,
heldout_loss, loss_by_position (held-out mean loss per chain position), early_loss, late_loss,
icl_score, induction_score / induction_head (the best layer-1 head's attention mass, from each
token with an earlier occurrence, on the positions right after its earlier occurrences; about 0.2
for uniform attention), previous_token_score / previous_token_head (the best layer-0 head's
attention to the previous state), and every head's scores; at the top, the ideal curves and the
steps by which the ICL score and the induction score made half their change. DIR/heldout.txt holds
64 of the held-out chains as text (symbols separated by spaces, one chain per paragraph, a blank
line between), checked to tokenize back to the same ids.

Measured on 2 shared CPU cores at 1 thread: 45-50 s for the whole run (train, measure, save).
Seeds 0, 1, 2: the induction score rises from 0.23 to 0.81-0.84 and the ICL score falls from 0.00
to -0.16..-0.18; half of each change is reached within 10 steps of the other (induction first; the
previous-token head sharpens more slowly, from 0.04 to 0.63-0.73 at step 600). The largest
checkpoint-to-checkpoint fall of the ICL score is within one checkpoint of the largest rise of the
induction score for seeds 0 and 1, two checkpoints (20 steps) after it for seed 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_toy  # noqa: E402  (the sibling script: tokenizer, checkpoint picking, atomic saving)

K = 5  # states of each chain: symbols t0..t{K-1}, ids 4..4+K-1 (ids 0..3 are train_toy's specials)
T = 100  # chain length; each sequence is BOS + T symbols
BATCH = 64
STEPS = 600
SEED = 0
HELDOUT_SEED = 1_000_003  # held-out chains come from seed HELDOUT_SEED + seed, never a training seed
N_HELDOUT = 512  # held-out sequences measured at each snapshot
N_HELDOUT_TEXT = 64  # of those, written to heldout.txt
EARLY = range(4, 9)  # chain positions (0-based index of the predicted symbol) of the early loss
LATE = range(T - 10, T)  # ... and of the late loss: the last 10
LR = 1e-3
WARMUP = 50


def sample_chains(generator: torch.Generator, batch: int) -> torch.Tensor:
    """BOS and then T states of a Markov chain, a fresh chain per row.

    Each row draws its own transition matrix, every row of it from Dirichlet(1) (uniform on the
    simplex), and a uniform initial state. Returns ids [batch, 1 + T]: BOS (1) at position 0, as in
    train_toy, then the states as symbol ids 4..4+K-1.
    """
    exp = -torch.log(torch.rand(batch, K, K, generator=generator).clamp_min(1e-12))
    transition = exp / exp.sum(-1, keepdim=True)  # normalised exponentials are Dirichlet(1)
    states = torch.empty(batch, T, dtype=torch.long)
    states[:, 0] = torch.randint(K, (batch,), generator=generator)
    rows = torch.arange(batch)
    for t in range(1, T):
        states[:, t] = torch.multinomial(transition[rows, states[:, t - 1]], 1, generator=generator)[:, 0]
    bos = torch.ones(batch, 1, dtype=torch.long)
    return torch.cat([bos, states + 4], dim=1)


def build_tokenizer():
    """train_toy's word-level tokenizer, over K symbols t0..t{K-1} instead of its 60."""
    with mock.patch.object(train_toy, "N_SYMBOLS", K):
        return train_toy.build_tokenizer()


def build_model(seed: int, hidden: int = 32, heads: int = 2) -> LlamaForCausalLM:
    """A 2-layer attention-only Llama: the MLPs are zero and frozen, so they add exactly 0."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=4 + K,
        hidden_size=hidden,
        intermediate_size=1,  # the smallest MLP; its weights are zeroed below
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:
        for weight in layer.mlp.parameters():
            weight.data.zero_()
            weight.requires_grad_(False)
    return model


def check_attention_only(model: LlamaForCausalLM, ids: torch.Tensor) -> None:
    """Every MLP's output is exactly zero (and stays so: its weights are frozen at zero)."""
    outputs = []
    hooks = [
        layer.mlp.register_forward_hook(lambda _m, _i, out: outputs.append(out))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(outputs) == model.config.num_hidden_layers
    assert all(bool((out == 0).all()) for out in outputs), "an MLP contributes a nonzero output"


def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, T]: the loss of predicting chain position i (ids[:, 1 + i]) from what precedes it."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")


def train(model: LlamaForCausalLM, steps: int, seed: int):
    """Train in place on next-token loss over whole chains, yielding (step, loss) after each update."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP))
    generator = torch.Generator().manual_seed(seed)
    for step in range(1, steps + 1):
        ids = sample_chains(generator, BATCH)
        loss = token_losses(model(ids).logits, ids).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        yield step, loss.item()


def match_sources(ids: torch.Tensor) -> torch.Tensor:
    """[B, L, L] bool: key j is right after an earlier occurrence of query i's token (ids[j-1] ==
    ids[i], 2 <= j <= i; position 0 is BOS, so j-1 is a chain state). This is where a statistical
    induction head looks: the symbols that followed the current one before."""
    length = ids.shape[1]
    same = ids[:, :, None] == ids[:, None, :]  # [B, i, j-1]
    source = torch.zeros(ids.shape[0], length, length, dtype=torch.bool)
    source[:, :, 2:] = same[:, :, 1:-1]
    return source & torch.ones(length, length, dtype=torch.bool).tril()


def measure(model: LlamaForCausalLM, ids: torch.Tensor) -> dict:
    """Held-out per-position loss, ICL score and per-head induction / previous-token scores."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    model.train(was_training)
    curve = token_losses(out.logits, ids).mean(0)  # [T]
    early = curve[EARLY.start : EARLY.stop].mean().item()
    late = curve[LATE.start : LATE.stop].mean().item()
    source = match_sources(ids)
    has_source = source.any(-1)  # queries with at least one earlier occurrence
    has_source[:, :2] = False
    prev, ind = {}, {}
    queries = torch.arange(2, ids.shape[1])  # chain states with a chain state before them
    for layer, attn in enumerate(out.attentions):
        for head in range(attn.shape[1]):
            a = attn[:, head]
            prev[(layer, head)] = a[:, queries, queries - 1].mean().item()
            ind[(layer, head)] = (a * source).sum(-1)[has_source].mean().item()
    return {
        "curve": curve.tolist(),
        "loss": curve.mean().item(),
        "early": early,
        "late": late,
        "icl": late - early,
        "prev": prev,
        "ind": ind,
    }


def reference_curves(ids: torch.Tensor) -> dict[str, list[float]]:
    """Per-position held-out loss of two ideal in-context predictors, for comparison.

    "bigram" is the Bayes-optimal predictor for these chains: with rows drawn from Dirichlet(1),
    the posterior predictive of the next state is Laplace's rule on the transitions seen so far,
    (count(prev -> next) + 1) / (count(prev -> any) + K). "unigram" applies the same rule to the
    counts of the states seen so far, ignoring the previous state (what a model without induction
    heads can do in context).
    """
    states = ids[:, 1:] - 4
    rows = torch.arange(states.shape[0])
    unigram = torch.ones(states.shape[0], K)
    bigram = torch.ones(states.shape[0], K, K)
    curves: dict[str, list[float]] = {"unigram": [math.log(K)], "bigram": [math.log(K)]}
    unigram[rows, states[:, 0]] += 1
    for i in range(1, states.shape[1]):
        prev, now = states[:, i - 1], states[:, i]
        p_uni = unigram[rows, now] / unigram.sum(-1)
        p_bi = bigram[rows, prev, now] / bigram[rows, prev].sum(-1)
        curves["unigram"].append(-p_uni.log().mean().item())
        curves["bigram"].append(-p_bi.log().mean().item())
        unigram[rows, now] += 1
        bigram[rows, prev, now] += 1
    return curves


def window_means(curve: list[float]) -> dict[str, float]:
    early = sum(curve[EARLY.start : EARLY.stop]) / len(EARLY)
    late = sum(curve[LATE.start : LATE.stop]) / len(LATE)
    return {"early_loss": round(early, 4), "late_loss": round(late, 4), "icl_score": round(late - early, 4)}


def best(scores: dict, layer: int) -> tuple[int, int]:
    return max((h for h in scores if h[0] == layer), key=scores.get)


def write_heldout(out: Path, ids: torch.Tensor) -> None:
    """heldout.txt: one chain per paragraph, symbols separated by single spaces, atomic; checked to
    tokenize back to the same ids (the tokenizer adds no BOS, like train_toy's)."""
    tokenizer = build_tokenizer()
    paragraphs = [" ".join(f"t{i - 4}" for i in row[1:].tolist()) for row in ids]
    for text, row in zip(paragraphs, ids, strict=True):
        enc = tokenizer(text, add_special_tokens=True)["input_ids"]
        bos = [tokenizer.bos_token_id] if enc[:1] == [tokenizer.bos_token_id] else []
        assert enc == bos + row[1:].tolist(), "heldout.txt does not tokenize back to its ids"
    tmp = out / f".heldout.txt.{os.getpid()}"
    tmp.write_text("\n\n".join(paragraphs) + "\n")
    os.replace(tmp, out / "heldout.txt")


def save_checkpoints(out: Path, n: int, steps: int, seed: int) -> list[dict]:
    """Train, snapshotting every few steps, then save n snapshots spanning the phase change."""
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    every = train_toy.snapshot_every(steps)
    heldout = sample_chains(torch.Generator().manual_seed(HELDOUT_SEED + seed), N_HELDOUT)
    reference = {"uniform": round(math.log(K), 4)}
    for name, curve in reference_curves(heldout).items():
        reference[name] = {**window_means(curve), "loss_by_position": [round(x, 4) for x in curve]}
        print(f"ideal in-context {name}: {window_means(curve)}")
    model = build_model(seed)
    check_attention_only(model, heldout[:4])
    snapshots = {}  # step -> (state dict, record for steps.json)
    losses = []
    for step, loss in train(model, steps, seed):
        losses.append(loss)
        if step % every and step != steps:
            continue
        m = measure(model, heldout)
        prev_head, ind_head = best(m["prev"], 0), best(m["ind"], 1)
        record = {
            "step": step,
            "train_loss": round(sum(losses) / len(losses), 4),
            "heldout_loss": round(m["loss"], 4),
            "icl_score": round(m["icl"], 4),
            "early_loss": round(m["early"], 4),
            "late_loss": round(m["late"], 4),
            "induction_score": round(m["ind"][ind_head], 4),
            "induction_head": train_toy.head_name(ind_head),
            "previous_token_score": round(m["prev"][prev_head], 4),
            "previous_token_head": train_toy.head_name(prev_head),
            "induction_scores": {train_toy.head_name(k): round(v, 4) for k, v in m["ind"].items()},
            "previous_token_scores": {train_toy.head_name(k): round(v, 4) for k, v in m["prev"].items()},
            "loss_by_position": [round(x, 4) for x in m["curve"]],
        }
        snapshots[step] = ({k: v.detach().clone() for k, v in model.state_dict().items()}, record)
        losses = []
        print(
            f"step {step:5d}  train loss {record['train_loss']:.4f}  icl {record['icl_score']:+.4f}"
            f"  induction {record['induction_score']:.3f}  previous-token {record['previous_token_score']:.3f}",
            flush=True,
        )
    train_time = time.monotonic() - start
    check_attention_only(model, heldout[:4])

    # Dense where the ICL score falls (its running minimum), geometric elsewhere.
    chosen = train_toy.pick_checkpoints(list(snapshots), [r["icl_score"] for _, r in snapshots.values()], n)
    halves = half_way([r for _, r in snapshots.values()])
    records = []
    with mock.patch.object(train_toy, "N_SYMBOLS", K):  # save_atomic saves train_toy's tokenizer
        for step in chosen:
            state, record = snapshots[step]
            model.load_state_dict(state)
            name = f"step-{step:05d}"
            train_toy.save_atomic(model, out, name)
            records.append({"name": name, **record})
    write_heldout(out, heldout[:N_HELDOUT_TEXT])
    summary = {
        "seed": seed,
        "steps": steps,
        "snapshot_every": every,
        "states": K,
        "chain_length": T,
        "heldout_sequences": N_HELDOUT,
        "early_positions": [EARLY.start, EARLY.stop - 1],
        "late_positions": [LATE.start, LATE.stop - 1],
        "reference": reference,
        "phase_change": halves,
        "checkpoints": records,
    }
    tmp = out / f".steps.json.{os.getpid()}"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / "steps.json")
    total = time.monotonic() - start
    print(f"saved {len(chosen)} checkpoints to {out}: steps {chosen}")
    print(f"time: {train_time:.0f} s training and measuring, {total:.0f} s in all")
    print(f"\n{'step':>6} {'train loss':>10} {'icl score':>10} {'induction':>10} {'prev-token':>10}")
    for r in records:
        print(
            f"{r['step']:6d} {r['train_loss']:10.4f} {r['icl_score']:10.4f}"
            f" {r['induction_score']:10.4f} {r['previous_token_score']:10.4f}"
        )
    print(
        f"half of the ICL score's fall by step {halves['icl_half_step']}, half of the induction score's"
        f" rise by step {halves['induction_half_step']} (snapshots every {every} steps)"
    )
    check_phase_change(records)
    return records


def half_way(snapshots: list[dict]) -> dict[str, int]:
    """The first snapshot step by which the ICL score has made half its fall (to its minimum), and
    the induction score half its rise (to its maximum): a measure of when each changes that does
    not depend on how the checkpoints are spaced."""
    icl = [r["icl_score"] for r in snapshots]
    ind = [r["induction_score"] for r in snapshots]
    icl_mid = (icl[0] + min(icl)) / 2
    ind_mid = (ind[0] + max(ind)) / 2
    return {
        "icl_half_step": next(r["step"] for r, x in zip(snapshots, icl, strict=True) if x <= icl_mid),
        "induction_half_step": next(r["step"] for r, x in zip(snapshots, ind, strict=True) if x >= ind_mid),
    }


def check_phase_change(records: list[dict]) -> bool:
    """The ICL score falls from about 0 to clearly negative, the induction score rises, and the
    largest fall of the one is within a checkpoint of the largest rise of the other."""
    icl = [r["icl_score"] for r in records]
    ind = [r["induction_score"] for r in records]
    drop = min(range(1, len(icl)), key=lambda i: icl[i] - icl[i - 1])
    rise = max(range(1, len(ind)), key=lambda i: ind[i] - ind[i - 1])
    checks = {
        f"icl score at first checkpoint about 0 ({icl[0]:+.3f})": abs(icl[0]) < 0.05,
        f"icl score at last checkpoint clearly negative ({icl[-1]:+.3f})": icl[-1] < -0.1,
        f"induction score rises ({ind[0]:.3f} -> {ind[-1]:.3f})": ind[-1] - ind[0] > 0.3,
        f"largest icl drop (to step {records[drop]['step']}) within one checkpoint of largest induction"
        f" rise (to step {records[rise]['step']})": abs(drop - rise) <= 1,
    }
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return all(checks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="save the checkpoints here")
    parser.add_argument("--checkpoints", type=int, default=8, help="checkpoints to save (default 8)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed for weights and data (default {SEED})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    if args.checkpoints < 2:
        parser.error("--checkpoints must be at least 2")
    torch.set_num_threads(args.threads)
    save_checkpoints(args.out, args.checkpoints, args.steps, args.seed)


if __name__ == "__main__":
    main()

"""The rest of each head's card: what it writes (its OV circuit, from the weights alone) and whether
it matters (mean ablation on the evaluation windows, against random heads of its layer).

**What it writes** is read with the machinery of ``headscope weights`` (:mod:`headscope.weightroles.ov`):
the same seeded sample of ordinary tokens, the same effective embedding, the same exact rank test.
Per head, ``copying`` and ``suppression`` are the shares of sampled tokens whose own token is
among the ``k`` highest (lowest) logits the head writes when it attends to that token: the
``copying`` and ``suppression`` scores of ``headscope weights`` with the same ``--tokens``,
``--k`` and ``--seed``. ``promotes`` and ``suppresses`` are the tokens with the highest (lowest)
logit in the head's mean write over the sample (what it writes whatever it attends to), centred
over the ordinary vocabulary. Where ``weights`` refuses the model (no LM head, or a conformance
check of the DLA or OV views fails), every card says why in one line instead.

**Whether it matters** ablates heads one at a time (their output replaced by its mean at each
position over the evaluation windows, :class:`headscope.capture.Ablation`) and measures the mean
next-token loss on every content token of the evaluation windows, never the fit windows. A
head's ``loss_increase`` is the ablated minus the clean loss (nats per token) with a 95% bootstrap
interval over windows (paired); ``random_layer`` is the same, averaged over random heads of its
own layer (:func:`headscope.verdicts.heads.random_control`), or over every other head of its layer
with ``--ablate all``.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from headscope import capture
from headscope.errors import HeadscopeError, InputError
from headscope.verdicts.heads import random_control
from headscope.verdicts.stats import MIN_EXAMPLES, bootstrap_ratio_ci
from headscope.weightroles.ov import Candidates, Circuits, ordinary_ids, rank_tests

from .atlas import Atlas

WRITES_TOKENS = 128  # sampled tokens (headscope weights --tokens; its default 2000 costs ~15x here)
WRITES_K = 5  # top-k of the copying test (as headscope weights --k)
WRITES_EMBEDDING = "mlp0"
WRITES_TOP = 5  # tokens shown per head
ABLATE_DRAWS = 3  # random same-layer heads per ablated head
ABLATE_HELP = (
    "Ablate heads one at a time on the evaluation windows (mean ablation; next-token loss against "
    "random heads of the same layer): N (the N heads with the least attention on the first token), "
    "all, or a list like L1H0,L0H3. Each head costs one forward pass over the windows. Causal LMs only."
)
_HEAD = re.compile(r"^L([0-9]+)H([0-9]+)$", re.IGNORECASE)


# --- what it writes -------------------------------------------------------------------------------------


def writes_refusal(loaded: Any) -> str | None:
    """Why ``headscope weights`` would not read this model's OV circuits (one line), or None."""
    if not loaded.has_lm_head:
        return f"{loaded.name} has no LM head, so there are no logits to read what a head writes"
    for view in ("dla", "ov"):
        result = capture.checks.check(loaded, view)
        if not result.ok:
            return (
                f"headscope's {capture.checks.WHAT[view]} do not reproduce "
                f"{loaded.model.config.model_type}: {result.reason}"
            )
    return None


def _token(tokenizer: Any, index: int) -> str:
    text = tokenizer.decode([index])
    return text if text else str(tokenizer.convert_ids_to_tokens(index))


def head_writes(
    loaded: Any,
    *,
    tokens: int = WRITES_TOKENS,
    k: int = WRITES_K,
    top: int = WRITES_TOP,
    seed: int = 0,
    embedding: str = WRITES_EMBEDDING,
) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[str, Any]]:
    """Per head (layer, head): ``promotes``, ``suppresses`` (token, id, centred logit), ``copying``,
    ``suppression``; and the model-level record. A refused model: every head gets ``reason``."""
    started = time.perf_counter()
    layout = loaded.layout
    every = [(layer, head) for layer in range(layout.n_layers) for head in range(layout.n_heads)]
    record: dict[str, Any] = {"tokens": None, "k": k, "embedding": embedding, "seed": seed, "reason": None}
    reason = writes_refusal(loaded)
    if reason is None:
        try:
            found, n_tokens = _read_writes(
                loaded, tokens=tokens, k=k, top=top, seed=seed, embedding=embedding
            )
        except HeadscopeError as exc:  # weights' own refusals (a layout it cannot read), as one line
            reason = str(exc).splitlines()[0]
    if reason is not None:
        record["reason"] = reason
        record["seconds"] = round(time.perf_counter() - started, 3)
        return {key: {"reason": reason} for key in every}, record
    record["tokens"] = n_tokens
    record["seconds"] = round(time.perf_counter() - started, 3)
    for key in every:
        found.setdefault(key, {"reason": "this layer has no attention heads"})
    return found, record


def _read_writes(
    loaded: Any, *, tokens: int, k: int, top: int, seed: int, embedding: str
) -> tuple[dict[tuple[int, int], dict[str, Any]], int]:
    circuits = Circuits(loaded)
    layout = loaded.layout
    candidates = ordinary_ids(loaded)
    if len(candidates) < k + 1:
        raise InputError(
            f"the vocabulary has {len(candidates)} ordinary tokens; too few to rank a head's writes"
        )
    # The sample and the rivals' order of headscope weights (same seed, same draws, same order).
    generator = torch.Generator().manual_seed(seed)
    n_tokens = min(tokens, len(candidates))
    sample = candidates[torch.randperm(len(candidates), generator=generator)[:n_tokens]]
    raw, effective = circuits.embeddings(sample, embedding)  # type: ignore[arg-type]
    unembed = circuits.unembed
    own_rows = unembed[sample]
    rivals = Candidates.of(candidates, unembed, generator)
    vocab = unembed[candidates]  # [C, D]
    tokenizer = loaded.tokenizer
    shown = min(top, len(candidates))
    out: dict[tuple[int, int], dict[str, Any]] = {}

    def listed(order: torch.Tensor, logits: torch.Tensor) -> list[dict[str, Any]]:
        return [
            {
                "token": _token(tokenizer, int(candidates[i])),
                "id": int(candidates[i]),
                "logit": round(float(logits[i]), 4),
            }
            for i in order.tolist()
        ]

    for index in layout.attention_layers:
        layer = circuits.layer(index)
        values = layer.values(circuits.layer_inputs(layer, index, raw, effective))  # [kv, N, Dv]
        groups = values.mean(1)  # [kv, Dv]: each KV group's mean value over the sample
        heads = range(layout.n_heads)
        mean_writes = torch.stack([groups[h // layout.group_size] @ layer.w_o[h] for h in heads])  # [H, D]
        logits = vocab @ mean_writes.T  # [C, H]: every head's mean write in logits, one pass over W_U
        logits = logits - logits.mean(0)
        for head in heads:
            in_top, in_bottom = rank_tests(
                values[head // layout.group_size], layer.w_o[head], own_rows, sample, rivals, k
            )
            column = logits[:, head]
            out[(index, head)] = {
                "promotes": listed(torch.topk(column, shown).indices, column),
                "suppresses": listed(torch.topk(-column, shown).indices, column),
                "copying": round(float(in_top.double().mean()), 6),
                "suppression": round(float(in_bottom.double().mean()), 6),
            }
    return out, n_tokens


def add_writes(atlas: Atlas, loaded: Any, *, seed: int = 0, tokens: int = WRITES_TOKENS) -> None:
    """Each head's ``writes`` on the atlas, and the model-level ``writes`` record."""
    per_head, record = head_writes(loaded, tokens=tokens, seed=seed)
    for entry in atlas.heads:
        entry["writes"] = per_head[(entry["layer"], entry["head"])]
    atlas.writes = record


# --- whether it matters ---------------------------------------------------------------------------------


def parse_ablate(value: str | int | None) -> str | int | list[tuple[int, int]] | None:
    """``--ablate``: None or "" (off), "all", a count N, or heads "L1H0,L0H3"."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    if text.lower() == "all":
        return "all"
    if text.isascii() and text.isdigit():
        n = int(text)
        return None if n == 0 else n
    heads = []
    for part in (p.strip() for p in text.split(",")):
        match = _HEAD.match(part)
        if match is None:
            raise InputError(
                f"--ablate {text}: {part!r} is not a head",
                hint="give a count (--ablate 8), all, or heads like L1H0,L0H3",
            )
        heads.append((int(match.group(1)), int(match.group(2))))
    return list(dict.fromkeys(heads))


def check_ablate(loaded: Any, value: str | int | None) -> None:
    """Refuse ``--ablate`` before the first forward pass: a model with no next-token loss, or heads
    it does not have."""
    spec = parse_ablate(value)
    if spec is None:
        return
    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError(
            f"--ablate {value}: ablation measures next-token loss, so it needs a causal language model "
            f"with an LM head; {loaded.name} is not one",
            hint="drop --ablate",
        )
    layout = loaded.layout
    available = [(lay, h) for lay in layout.attention_layers for h in range(layout.n_heads)]
    if isinstance(spec, int) and spec > len(available):
        raise InputError(
            f"--ablate {value}: {loaded.name} has {len(available)} heads",
            hint=f"give at most {len(available)}, or all",
        )
    if isinstance(spec, list):
        missing = [f"L{lay}H{h}" for lay, h in spec if (lay, h) not in set(available)]
        if missing:
            raise InputError(
                f"--ablate {value}: {loaded.name} has no head {', '.join(missing)} "
                f"({layout.n_layers} layers x {layout.n_heads} heads)",
                hint="count layers and heads from 0",
            )


def chosen_heads(atlas: Atlas, loaded: Any, spec: str | int | list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The heads ``--ablate`` names: all, the N with the least attention on the first token, or a list."""
    attending = set(loaded.layout.attention_layers)
    heads = [h for h in atlas.heads if h["layer"] in attending]
    if spec == "all":
        return [(h["layer"], h["head"]) for h in heads]
    if isinstance(spec, int):
        order = sorted(heads, key=lambda h: (h["first_token"], h["layer"], h["head"]))
        return sorted((h["layer"], h["head"]) for h in order[:spec])
    return list(spec)


def _window_losses(
    loaded: Any, batches: Sequence[capture.Batch], n_windows: int, ablation: capture.Ablation | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per evaluation window: the summed next-token loss over its content tokens, and their count."""
    sums = np.zeros(n_windows)
    counts = np.zeros(n_windows)

    def on_token_loss(losses: torch.Tensor, batch: capture.Batch) -> None:
        target = batch.content[:, 1:].to(losses.device)  # predicting token t from position t - 1
        kept = torch.where(
            target, losses.double(), torch.zeros((), dtype=torch.float64, device=losses.device)
        )
        for row, window in enumerate(batch.example_index.tolist()):
            sums[window] += float(kept[row].sum())
            counts[window] += float(target[row].sum())

    capture.run(loaded, batches, capture.Pass(reads=[capture.TokenLosses(on_token_loss)], edits=[ablation]))
    return sums, counts


def _increase(diff: np.ndarray, counts: np.ndarray, n_resamples: int, seed: int) -> dict[str, float | None]:
    value = float(diff.sum() / max(counts.sum(), 1.0))
    low = high = None
    if n_resamples > 0:
        lo, hi = bootstrap_ratio_ci(
            torch.as_tensor(diff)[:, None], torch.as_tensor(counts), n_resamples=n_resamples, seed=seed
        )
        low, high = float(lo[0]), float(hi[0])
        low = low if np.isfinite(low) else None
        high = high if np.isfinite(high) else None

    def clean(x: float | None) -> float | None:
        return None if x is None else round(x, 6)

    return {"value": clean(value), "ci_low": clean(low), "ci_high": clean(high)}


def _no_interval(increase: dict[str, Any], n_resamples: int, n_windows: int) -> dict[str, str]:
    """Why an increase has no interval (``{"no_interval": reason}``), or nothing where it has one."""
    if increase["ci_low"] is not None and increase["ci_high"] is not None:
        return {}
    if n_resamples <= 0:
        return {"no_interval": "resamples=0: no bootstrap was drawn"}
    if n_windows < MIN_EXAMPLES:
        return {"no_interval": f"{n_windows} evaluation windows, fewer than {MIN_EXAMPLES}"}
    return {"no_interval": "the bootstrap gave no finite bounds"}


def add_ablation(
    atlas: Atlas,
    loaded: Any,
    batches: Sequence[capture.Batch],
    value: str | int | None,
    *,
    draws: int = ABLATE_DRAWS,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: Any = None,
) -> None:
    """``--ablate``: each chosen head's ``matters`` on the atlas, and the model-level ``ablation``."""
    spec = parse_ablate(value)
    if spec is None:
        return
    check_ablate(loaded, value)
    started = time.perf_counter()
    layout = loaded.layout
    targets = chosen_heads(atlas, loaded, spec)
    rng = random.Random(seed)
    controls: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for layer, head in targets:
        if spec == "all":
            controls[(layer, head)] = [(layer, h) for h in range(layout.n_heads) if h != head]
        else:
            n = min(draws, layout.n_heads - 1)
            controls[(layer, head)] = random_control([(layer, head)] * n, layout, rng) if n else []
    measured = list(dict.fromkeys([*targets, *(c for cs in controls.values() for c in cs)]))
    n_windows = 1 + max(int(i) for b in batches for i in b.example_index.tolist())
    advance = progress("describe: ablate", len(measured) + 2) if progress else None
    means = capture.head_output_means(loaded, batches, measured)
    if advance:
        advance(1)
    clean_sums, counts = _window_losses(loaded, batches, n_windows, None)
    if advance:
        advance(1)
    effect: dict[tuple[int, int], np.ndarray] = {}
    for pair in measured:
        sums, _ = _window_losses(loaded, batches, n_windows, capture.Ablation.of([pair], "mean", means))
        effect[pair] = sums - clean_sums
        if advance:
            advance(1)
    total = max(float(counts.sum()), 1.0)
    for entry in atlas.heads:
        key = (entry["layer"], entry["head"])
        if key not in controls:
            continue
        increase = _increase(effect[key], counts, n_resamples, seed)
        random_effects = [float(effect[c].sum() / total) for c in controls[key]]
        random_mean = float(np.mean(random_effects)) if random_effects else None
        matters: dict[str, Any] = {
            "loss_increase": increase,
            **_no_interval(increase, n_resamples, n_windows),
            "random_layer": None if random_mean is None else round(random_mean, 6),
            "random_heads": [list(c) for c in controls[key]],
        }
        layer_heads = [(key[0], h) for h in range(layout.n_heads)]
        if all(h in effect for h in layer_heads):
            ranked = sorted(layer_heads, key=lambda h: -float(effect[h].sum()))
            matters["rank_in_layer"] = ranked.index(key) + 1
        entry["matters"] = matters
    clean = float(clean_sums.sum() / total)
    atlas.ablation = {
        "mode": "mean",
        "heads": len(targets),
        "chosen": "all"
        if spec == "all"
        else (
            f"the {spec} heads with the least attention on the first token"
            if isinstance(spec, int)
            else "listed"
        ),
        "draws": None if spec == "all" else min(draws, layout.n_heads - 1),
        "controls": "every other head of its layer" if spec == "all" else "random heads of its layer",
        "windows": n_windows,
        "tokens": int(counts.sum()),
        "clean_loss": round(clean, 6),
        "passes": len(measured) + 2,
        "seconds": round(time.perf_counter() - started, 3),
        "interval": "95% bootstrap over evaluation windows (paired)",
    }


# --- how the card says it -----------------------------------------------------------------------------


def _quoted(token: str) -> str:
    return "'" + token.replace("\n", "\\n").replace("\t", "\\t") + "'"


def writes_line(entry: dict[str, Any]) -> str | None:
    """ "writes: copies 0.83 of tokens, suppresses its own 0.01; its mean write promotes ' the' …
    and suppresses …", or why it was not read."""
    writes = entry.get("writes")
    if not writes:
        return None
    if writes.get("reason"):
        return f"writes: not read: {writes['reason']}"
    promotes = " ".join(_quoted(t["token"]) for t in writes["promotes"])
    suppresses = " ".join(_quoted(t["token"]) for t in writes["suppresses"])
    return (
        f"writes: copies {writes['copying']:.2f} of tokens, suppresses its own {writes['suppression']:.2f}; "
        f"its mean write promotes {promotes} and suppresses {suppresses}"
    )


def matters_line(entry: dict[str, Any]) -> str | None:
    """ "ablating it raises the loss by 0.012 [0.008, 0.016] nats/token; random heads of its layer: 0.002"."""
    matters = entry.get("matters")
    if not matters:
        return None
    inc = matters["loss_increase"]
    value, low, high = inc["value"], inc.get("ci_low"), inc.get("ci_high")
    bounded = low is not None and high is not None
    if value >= 0:
        ci = f" [{low:.4f}, {high:.4f}]" if bounded else ""
        text = f"ablating it raises the loss by {value:.4f}{ci} nats/token"
    else:  # the interval of the decrease: the increase's, negated and turned round
        ci = f" [{-high:.4f}, {-low:.4f}]" if bounded else ""
        text = f"ablating it lowers the loss by {-value:.4f}{ci} nats/token"
    if not bounded:
        # An atlas written before the reason was recorded: the one cause it then had.
        reason = matters.get("no_interval") or f"fewer than {MIN_EXAMPLES} evaluation windows"
        text += f" (no interval: {reason})"
    if matters.get("random_layer") is not None:
        text += f"; random heads of its layer: {matters['random_layer']:.4f}"
    if matters.get("rank_in_layer") is not None:
        text += f" (rank {matters['rank_in_layer']} in its layer)"
    return text


def complete_cards(
    atlas: Atlas, loaded: Any, batches: Sequence[capture.Batch], options: Any, progress: Any
) -> None:
    """What describe adds to every card after the description: the writes (``--writes``, on by
    default) and the ablation (``--ablate``, off by default)."""
    if getattr(options, "writes", True):
        add_writes(atlas, loaded, seed=options.seed)
    add_ablation(
        atlas,
        loaded,
        batches,
        getattr(options, "ablate", None),
        n_resamples=options.resamples,
        seed=options.seed,
        progress=progress,
    )

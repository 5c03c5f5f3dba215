"""``icl``: in-context learning measured beside the heads that are said to carry it.

Three public claims, each measured on the model in hand:

* **The ICL score** (Olsson et al. 2022): the loss at a late token of a context minus the loss at an
  early one (tokens 500 and 50), averaged over texts. It is negative when later tokens are predicted
  better because the context helps. Here: the loss at every position (the curve), and the score with
  a 95% bootstrap interval over texts, averaged over ``±window`` positions around each end.
* **Few-shot accuracy** on tasks shipped as data (``configs/icl/``): the top-1 next token against
  the single-token answer at 0, 1, 5 and 10 shots, with intervals over queries.
* **Function-vector heads** (Todd et al. 2024): a head's average indirect effect (AIE) is the gain in
  the correct answer's probability when its mean output at the last token over clean few-shot prompts
  is patched into prompts whose demonstrations have shuffled labels. The top-K heads' mean writes,
  summed, are the function vector; added to the residual stream at one layer of a zero-shot prompt
  it should make the model do the task, and more than a vector from K random heads of the same
  layers does. The layer is chosen on half of the queries and reported on the other half.

``--verify`` is Yin and Steinhardt's (2025) comparison: the top-K induction heads, the top-K FV heads
(heads top in both lists left out of both) and K random heads of the same layers, each replaced by
its mean output, and the effect on the ICL score and on few-shot accuracy.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope import capture
from headscope.capture.dla import HeadWrites, attention_layers
from headscope.capture.logits import output_logits
from headscope.capture.stream import prepared
from headscope.data.icl import ICLPair, ICLTask, answer_ids, load_tasks
from headscope.data.prompts import configs_dir, display_path, split_paragraphs
from headscope.detectors.base import DetectorResult
from headscope.errors import InputError, PromptSetError
from headscope.extend.base import ProgressFactory, RepeatSpec, Report, model_batches, report_sections
from headscope.extend.checks import Check, one_check, too_many
from headscope.extend.protocol import (
    ENTRY,
    HELP_BATCH,
    HELP_DRAWS,
    Analysis,
    Outcome,
    Output,
    Stats,
    option,
    register,
    spelled,
)
from headscope.extend.writers import html_report
from headscope.models import LoadedModel, anatomy, projections
from headscope.verdicts.heads import Head, top_heads
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import RoleRule, assign_roles
from headscope.verdicts.stats import bootstrap_ratio

from .icl_present import icl_png
from .induction import induction

DEFAULT_TEXTS = ("retrieval/haystack-en.txt", "retrieval/haystack-zh.txt")
FV_DATA = "icl-tasks"


# --- records -----------------------------------------------------------------------------------------


def _ci(values: np.ndarray | torch.Tensor, n_resamples: int, seed: int) -> tuple[float, float]:
    """95% bootstrap interval of the mean of ``values`` [N] (NaN, NaN when resampling is off)."""
    values = torch.as_tensor(np.asarray(values, dtype=np.float64))
    if n_resamples == 0 or len(values) < 2:
        return (float("nan"), float("nan"))
    low, high, _ = bootstrap_ratio(
        values[:, None], torch.ones(len(values), dtype=torch.float64), n_resamples=n_resamples, seed=seed
    )
    return (float(low[0]), float(high[0]))


@dataclass
class Estimate:
    """A mean with its 95% bootstrap interval and the number of units resampled."""

    mean: float
    ci: tuple[float, float]
    n: int

    @classmethod
    def of(cls, values: Any, n_resamples: int, seed: int) -> Estimate:
        values = np.asarray(values, dtype=np.float64)
        return cls(
            float(values.mean()) if len(values) else float("nan"), _ci(values, n_resamples, seed), len(values)
        )

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": list(self.ci), "n": self.n}


@dataclass
class ICLScore:
    """Olsson et al.'s ICL score on these texts: loss at ``late`` minus loss at ``early``."""

    score: Estimate  # over texts
    early: int  # the token positions used (1 = the text's first token)
    late: int
    window: int
    requested: tuple[int, int]
    curve: list[float]  # mean loss at token 1..len(curve) (NaN where no text has that token)
    curve_n: list[int]
    per_text: np.ndarray = field(repr=False)
    per_text_loss: np.ndarray = field(repr=False)  # [texts, positions] (for the ablation's pairing)

    def positions_note(self) -> str:
        asked = self.requested
        if (self.early, self.late) == asked:
            return f"tokens {self.late} and {self.early}"
        return f"tokens {self.late} and {self.early} (asked {asked[1]} and {asked[0]}: the nearest the texts allow)"

    def to_json(self) -> dict[str, Any]:
        return {
            "score": self.score.mean,
            "ci": list(self.score.ci),
            "texts": self.score.n,
            "early": self.early,
            "late": self.late,
            "window": self.window,
            "requested": list(self.requested),
            "loss_by_position": self.curve,
            "texts_by_position": self.curve_n,
        }


@dataclass
class ShotAccuracy:
    task: str
    shots: int
    accuracy: Estimate

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "shots": self.shots, **self.accuracy.to_json()}


@dataclass
class Transfer:
    """The function vector added at one layer of zero-shot prompts, against K random heads' vector."""

    k: int
    heads: list[Head]
    layer: int
    sweep: list[tuple[int, float]]  # (layer, accuracy on the selection half)
    zero_shot: Estimate  # the held-out half, nothing added
    function_vector: Estimate
    random_vector: Estimate  # pooled over draws
    random_draws: list[float]

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "heads": [list(h) for h in self.heads],
            "layer": self.layer,
            "layer_sweep": [{"layer": layer, "accuracy": acc} for layer, acc in self.sweep],
            "zero_shot": self.zero_shot.to_json(),
            "function_vector": self.function_vector.to_json(),
            "random_vector": self.random_vector.to_json(),
            "random_draws": self.random_draws,
        }


@dataclass
class ICLMeasures:
    """What ``headscope icl`` measured besides the head tables."""

    model: str
    score: ICLScore | None
    texts: list[str]
    accuracy: list[ShotAccuracy]
    fv_tasks: list[str]
    transfer: Transfer | None
    dropped: dict[str, int]  # task -> pairs left out (answer not one token for this tokenizer)

    def overall(self, shots: int) -> Estimate | None:
        rows = [a for a in self.accuracy if a.shots == shots and a.task == "all"]
        return rows[0].accuracy if rows else None

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope icl``)."""
        from .icl_present import print_icl

        print_icl(self, console)

    def to_json(self) -> dict[str, Any]:
        return {
            "icl_score": self.score.to_json() if self.score else None,
            "texts": self.texts,
            "accuracy": [a.to_json() for a in self.accuracy],
            "fv_tasks": self.fv_tasks,
            "transfer": self.transfer.to_json() if self.transfer else None,
            "dropped_pairs": self.dropped,
        }


@dataclass
class AblationCell:
    value: Estimate
    change: Estimate  # paired with the clean run, over the same texts or queries

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value.to_json(), "change": self.change.to_json()}


@dataclass
class ICLAblation:
    """Yin and Steinhardt's table: which heads' removal costs which kind of ICL."""

    k: int
    mode: str
    shots: int
    heads: dict[str, list[Head]]  # "induction", "fv"
    excluded: list[Head]  # top-K in both lists: in neither
    random_heads: list[list[Head]]
    clean: dict[str, Estimate]  # "icl_score", "accuracy"
    cells: dict[str, dict[str, AblationCell]]  # measure -> set ("induction", "fv", "random") -> cell

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope icl --verify``)."""
        from .icl_present import print_icl_ablation

        print_icl_ablation(self, console)

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "mode": self.mode,
            "shots": self.shots,
            "heads": {name: [list(h) for h in heads] for name, heads in self.heads.items()},
            "excluded": [list(h) for h in self.excluded],
            "random_heads": [[list(h) for h in draw] for draw in self.random_heads],
            "clean": {name: e.to_json() for name, e in self.clean.items()},
            "ablated": {
                measure: {name: cell.to_json() for name, cell in row.items()}
                for measure, row in self.cells.items()
            },
        }


# --- texts and the ICL score ---------------------------------------------------------------------------


def _specials(loaded: LoadedModel) -> tuple[list[int], list[int]]:
    """The tokens put before a text: the tokenizer's BOS where it defines one, whether or not it adds
    it itself (as the repeated-tokens protocol does, and as most causal LMs were trained)."""
    bos = loaded.tokenizer.bos_token_id
    return ([int(bos)] if bos is not None else []), []


def read_texts(path: str | Path) -> list[str]:
    """A text file's texts: paragraphs separated by blank lines (file:line errors)."""
    path = Path(path)
    takes = "give a UTF-8 text file: texts are paragraphs separated by blank lines"
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", hint=takes) from None
    except IsADirectoryError:
        raise InputError(f"{spelled('text', str(path))}: a folder, not a text file", hint=takes) from None
    except UnicodeDecodeError as exc:
        raise PromptSetError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})", hint="re-save it as UTF-8"
        ) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})", hint=takes) from None
    texts = split_paragraphs(raw)
    if not texts:
        raise PromptSetError(f"{path}: no text", hint="texts are paragraphs separated by blank lines")
    return texts


def default_texts() -> list[tuple[str, str]]:
    """The shipped haystacks, each one text (paragraphs joined), cut into windows later."""
    out = []
    for name in DEFAULT_TEXTS:
        path = configs_dir() / name
        out.append((display_path(path), "\n".join(read_texts(path))))
    return out


def _check_context(loaded: LoadedModel, context: int) -> None:
    prefix, suffix = _specials(loaded)
    limit = loaded.max_positions
    if limit is not None and context + len(prefix) + len(suffix) > limit:
        raise InputError(
            f"{spelled('context', context)} does not fit the model's context of {limit} tokens",
            hint=f"use {spelled('context', limit - len(prefix) - len(suffix))} or less",
        )


def text_windows(
    loaded: LoadedModel,
    sources: Sequence[tuple[str, str]],
    context: int,
    needed: int | None = None,
    *,
    notes: list[str] | None = None,
) -> tuple[list[list[int]], list[list[bool]], list[str]]:
    """Token windows of ``context`` tokens (plus BOS) from each text: a text longer than ``context``
    is cut into consecutive windows. A window shorter than ``needed`` tokens (the late end and its
    window) is left out while at least two windows reach it, so that one short tail does not move the
    late end for every text; otherwise every window is kept and the late end moves (said in the output).
    What was left out is said in ``notes``."""
    prefix, suffix = _specials(loaded)
    _check_context(loaded, context)
    pieces = []
    for index, (name, text) in enumerate(sources):
        ids = list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
        for start in range(0, len(ids), context):
            pieces.append((index, f"{name}#{start // context + 1}", ids[start : start + context]))
    if needed is not None and sum(len(p) >= needed for _, _, p in pieces) >= 2:
        kept = [(i, n, p) for i, n, p in pieces if len(p) >= needed]
        if notes is not None and len(kept) < len(pieces):
            notes.append(_short_windows_note(pieces, kept, len(sources), needed))
        pieces = kept
    pieces = [(n, p) for _, n, p in pieces]
    sequences = [prefix + piece + suffix for _, piece in pieces]
    specials = [[True] * len(prefix) + [False] * len(piece) + [True] * len(suffix) for _, piece in pieces]
    return sequences, specials, [n for n, _ in pieces]


def _short_windows_note(
    pieces: list[tuple[int, str, list[int]]],
    kept: list[tuple[int, str, list[int]]],
    n_texts: int,
    needed: int,
) -> str:
    """ "2 of 5 texts left out of the ICL score, shorter than 43 tokens ...": the texts none of whose
    windows reach the late end, and the short last windows of longer texts."""
    texts_kept = {i for i, _, _ in kept}
    gone = n_texts - len(texts_kept)
    tails = len(pieces) - len(kept) - sum(1 for i, _, _ in pieces if i not in texts_kept)
    said = []
    if gone:
        said.append(f"{gone} of {n_texts} text(s)")
    if tails:
        said.append(f"{tails} last window(s) of longer texts")
    return (
        f"{' and '.join(said)} left out of the ICL score: shorter than {needed} tokens "
        "(the late token and its window)"
    )


class PositionLoss:
    """Next-token loss per text and token position: ``loss[e, k - 1]`` is the loss of text e's token k."""

    def __init__(self, n_texts: int, context: int, prefix: int) -> None:
        self.loss = np.full((n_texts, context), np.nan)
        self.prefix = prefix

    def __call__(self, token_losses: torch.Tensor, batch: capture.Batch) -> None:
        losses = token_losses.double().cpu().numpy()  # [B, T-1]: column t predicts token t+1
        mask = (batch.attention_mask & ~batch.special).cpu().numpy()
        for row, example in enumerate(batch.example_index.tolist()):
            positions = np.nonzero(mask[row])[0]
            positions = positions[positions >= 1]  # the first position is never predicted
            tokens = positions - self.prefix  # 0-based token index in the text
            keep = (tokens >= 0) & (tokens < self.loss.shape[1])
            self.loss[example, tokens[keep]] = losses[row, positions[keep] - 1]


def score_positions(first: int, last: int, early: int, late: int, window: int) -> tuple[int, int]:
    """The (early, late) token positions compared when every text has tokens ``first..last``: the
    late end moves down to what the texts allow; refused when nothing is left to compare."""
    used_late = min(late, last - window)
    used_early = max(early, first + window)
    if used_late - window <= used_early + window:
        cli = ENTRY.get() == "cli"
        raise InputError(
            f"the texts allow tokens {first}..{last}: too short to compare token {late} with token {early} "
            f"over ±{window} positions",
            hint="give longer texts (--text), a smaller --early, --late or --window"
            if cli
            else "give longer texts (text=), a smaller early=, late= or window=",
        )
    return used_early, used_late


def icl_score(loss: np.ndarray, early: int, late: int, window: int, n_resamples: int, seed: int) -> ICLScore:
    """The score from per-text losses ``[texts, positions]``: the late end moves to the last position
    every text has (with its window) when the texts are shorter than ``late + window``."""
    have = (~np.isnan(loss)).sum(0)
    full = np.nonzero(have == loss.shape[0])[0]
    if len(full) == 0:
        raise InputError(
            "no token position is present in every text", hint="use longer texts or a smaller --context"
        )
    last = int(full.max()) + 1  # 1-based: every text has tokens up to here
    first = int(full.min()) + 1
    used_early, used_late = score_positions(first, last, early, late, window)

    def around(position: int) -> np.ndarray:
        return loss[:, position - 1 - window : position + window].mean(1)

    per_text = around(used_late) - around(used_early)
    curve = np.nansum(loss, axis=0) / np.maximum(have, 1)
    curve[have == 0] = np.nan
    return ICLScore(
        Estimate.of(per_text, n_resamples, seed),
        used_early,
        used_late,
        window,
        (early, late),
        [float(x) if np.isfinite(x) else float("nan") for x in curve],
        have.astype(int).tolist(),
        per_text,
        loss,
    )


def text_losses(
    loaded: LoadedModel,
    sequences: list[list[int]],
    specials: list[list[bool]],
    context: int,
    batch_size: int,
    *,
    ablation: capture.Ablation | None = None,
) -> np.ndarray:
    prefix = len(_specials(loaded)[0])
    meter = PositionLoss(len(sequences), context, prefix)
    batches = model_batches(loaded, sequences, specials, batch_size)
    capture.run(loaded, batches, capture.Pass(reads=[capture.TokenLosses(meter)], edits=[ablation]))
    return meter.loss


# --- few-shot prompts ----------------------------------------------------------------------------------


@dataclass
class Prompt:
    task: str
    ids: list[int]
    answer: int  # the answer's token id
    query: int  # index of the query pair in its task


@dataclass
class TaskData:
    task: ICLTask
    pairs: list[ICLPair]  # usable for this tokenizer
    answers: list[int]  # token id per usable pair
    queries: list[int]  # indices into pairs


def prepare_tasks(
    loaded: LoadedModel, tasks: Sequence[ICLTask], queries: int, seed: int, *, strict: bool = True
) -> tuple[list[TaskData], dict[str, int], list[str]]:
    """Each task's pairs whose answer is one token for this tokenizer, and its query indices; the
    pairs left out per task; and the tasks left out. A task with fewer than 12 single-token answers
    (10 demonstrations and a query) is refused when it was asked for by name (``strict``), and left
    out when the user asked for every shipped task (Chinese answers are rarely one SmolLM2 token)."""
    out, dropped, left_out = [], {}, []
    for task in tasks:
        ids, bad = answer_ids(task, loaded.tokenizer)
        usable = [i for i in range(len(task.pairs)) if i in ids]
        dropped[task.name] = len(bad)
        if len(usable) < 12 and not strict:
            left_out.append(task.name)
            continue
        if len(usable) < 12:
            raise InputError(
                f"{display_path(task.path)}: only {len(usable)} of {len(task.pairs)} answers are one token "
                "for this tokenizer; a 10-shot prompt needs 10 demonstrations and a query",
                hint="leave the task out (--tasks) or give answers that are single tokens",
            )
        pairs = [task.pairs[i] for i in usable]
        order = list(range(len(pairs)))
        random.Random(f"{seed}:{task.name}").shuffle(order)
        out.append(TaskData(task, pairs, [ids[i] for i in usable], order[: min(queries, len(order))]))
    if tasks and not out:
        raise InputError(
            "no shipped ICL task has 12 answers that are one token for this tokenizer",
            hint="give your own task files with --tasks",
        )
    return out, dropped, left_out


def _encode(loaded: LoadedModel, text: str) -> list[int]:
    prefix, _ = _specials(loaded)
    return prefix + list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])


def build_prompts(
    loaded: LoadedModel,
    data: TaskData,
    shots: int,
    seed: int,
    *,
    shuffled: bool = False,
    queries: Sequence[int] | None = None,
) -> list[Prompt]:
    """One prompt per query: ``shots`` demonstrations drawn (seeded) from the task's other pairs, then
    the query. ``shuffled``: the demonstrations' answers are permuted among them (Todd et al.'s
    corrupted prompts: the format stays, the mapping goes)."""
    prompts = []
    for q in data.queries if queries is None else queries:
        rng = random.Random(f"{seed}:{data.task.name}:{q}:{shots}")
        others = [i for i in range(len(data.pairs)) if i != q]
        if shots > len(others):  # check_loaded refuses this first; never report fewer as k-shot
            raise InputError(
                f"{shots}-shot prompts: task '{data.task.name}' has {len(data.pairs)} usable pairs, "
                f"so its prompts hold at most {len(others)} demonstrations beside the query"
            )
        demos = [data.pairs[i] for i in rng.sample(others, shots)]
        if shuffled and len(demos) > 1:
            answers = [d.y for d in demos]
            for _ in range(10):  # a permutation that moves every answer, where one exists
                rng.shuffle(answers)
                if all(a != d.y for a, d in zip(answers, demos, strict=True)):
                    break
            demos = [ICLPair(d.x, a, d.line) for d, a in zip(demos, answers, strict=True)]
        text = data.task.prompt(demos, data.pairs[q])
        prompts.append(Prompt(data.task.name, _encode(loaded, text), data.answers[q], q))
    return prompts


def _last(batch: capture.Batch) -> torch.Tensor:
    return batch.attention_mask.long().sum(1) - 1


def answer_probs(
    loaded: LoadedModel,
    prompts: Sequence[Prompt],
    batch_size: int,
    *,
    ablation: capture.Ablation | None = None,
    writes: HeadWrites | None = None,
    on_writes: Callable[[capture.Batch], None] | None = None,
    steer: tuple[int, torch.Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: whether the model's top next token is the answer, and the answer's probability.

    ``steer`` = (layer, vectors [N, D]) adds prompt i's vector to the residual stream after block
    ``layer`` at its last token (the function vector's test)."""
    n = len(prompts)
    correct, prob = np.zeros(n, dtype=bool), np.zeros(n)
    sequences = [p.ids for p in prompts]
    batches = model_batches(loaded, sequences, [[False] * len(s) for s in sequences], batch_size)

    def on_hidden(hidden: torch.Tensor, batch: capture.Batch) -> None:
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        logits = output_logits(loaded, hidden[rows, _last(batch).to(hidden.device)])
        answers = torch.as_tensor(
            [prompts[i].answer for i in batch.example_index.tolist()], device=logits.device
        )
        probs = torch.softmax(logits, -1)
        picked = probs.gather(1, answers[:, None])[:, 0]
        top = logits.argmax(-1)
        index = batch.example_index.cpu().numpy()
        prob[index] = picked.double().cpu().numpy()
        correct[index] = (top == answers).cpu().numpy()

    def on_batch_done(batch: capture.Batch) -> None:
        if on_writes is not None:
            on_writes(batch)

    steered = capture.AddVector(steer[0], steer[1], _last) if steer is not None else None
    capture.run(
        loaded,
        batches,
        capture.Pass(
            reads=[capture.FinalHidden(on_hidden), writes],
            edits=[ablation, steered],
            on_batch_done=on_batch_done,
        ),
    )
    return correct, prob


# --- function-vector heads -------------------------------------------------------------------------------


def _output_modules(loaded: LoadedModel) -> dict[int, torch.nn.Module]:
    blocks = anatomy.blocks(loaded.model)
    layers = attention_layers(loaded)
    return {i: projections.output_module(projections.attention_module(blocks[i])) for i in layers}


class _LastTokenHeads(HeadWrites):
    """HeadWrites that also keeps each head's raw output (the output projection's input) at the last
    token, for patching: ``raw[layer]`` ``[B, H, head_dim]``."""

    def reset(self) -> None:
        super().reset()
        self.raw: dict[int, torch.Tensor] = {}

    def add(self, layer: int, heads: torch.Tensor) -> None:
        if self._positions is not None:
            rows = torch.arange(heads.shape[0], device=heads.device)
            at = heads[rows, self._positions.to(heads.device)]
            self.raw[layer] = at.reshape(at.shape[0], self.loaded.layout.n_heads, -1).double().cpu()
        super().add(layer, heads)


@dataclass
class TaskMeans:
    """One task's clean few-shot prompts: each head's mean output and mean write at the last token."""

    raw: torch.Tensor  # [L, H, head_dim]
    writes: torch.Tensor  # [L, H, D] (the head's contribution to the residual stream)
    correct: np.ndarray  # clean accuracy on these prompts


def task_means(loaded: LoadedModel, prompts: Sequence[Prompt], batch_size: int) -> TaskMeans:
    layers = attention_layers(loaded)
    recorder = _LastTokenHeads(loaded, _last, keep=set(layers))
    L, H = loaded.layout.n_layers, loaded.layout.n_heads
    raw: torch.Tensor | None = None
    writes: torch.Tensor | None = None

    def on_writes(batch: capture.Batch) -> None:
        nonlocal raw, writes
        for layer in layers:
            r, w = recorder.raw[layer].sum(0), recorder.kept[layer].double().sum(0)
            if raw is None or writes is None:
                raw = torch.zeros(L, H, r.shape[-1], dtype=torch.float64)
                writes = torch.zeros(L, H, w.shape[-1], dtype=torch.float64)
            raw[layer] += r
            writes[layer] += w

    correct, _ = answer_probs(loaded, prompts, batch_size, writes=recorder, on_writes=on_writes)
    assert raw is not None and writes is not None
    return TaskMeans(raw / len(prompts), writes / len(prompts), correct)


def _patched_probs(
    loaded: LoadedModel, prompt: Prompt, means: torch.Tensor, layers: Sequence[int]
) -> torch.Tensor:
    """The answer's probability at the last token of ``prompt`` with each head of ``layers`` in turn
    given its mean output ``means[L, H, head_dim]`` there: ``[len(layers) * H + 1]`` (the last: none).

    The prompt's prefix runs once and is cached; the last token then runs once per (layer, head), as
    rows of one batch. Patching the last position cannot change an earlier one in a causal model, so
    this is exactly a full forward pass per patched head."""
    n_heads = loaded.layout.n_heads
    device = loaded.device
    ids = torch.as_tensor(prompt.ids, device=device)[None]
    rows = len(layers) * n_heads + 1
    base = loaded.base
    # transformers 5 names the KV cache ``cache`` (``past_key_values`` before, deprecated since).
    name = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    out = base(input_ids=ids[:, :-1], attention_mask=torch.ones_like(ids[:, :-1]), use_cache=True)
    cache = getattr(out, name)
    cache.batch_repeat_interleave(rows)
    # Row index * H + head patches that head of layers[index]; the last row patches none.
    patches = [
        capture.PatchHeads(layer, {head: means[layer, head]}, rows=(index * n_heads + head,), position=-1)
        for index, layer in enumerate(layers)
        for head in range(n_heads)
    ]
    with capture.applied(loaded, patches):
        last = ids[:, -1:].expand(rows, 1)
        out = base(
            input_ids=last,
            attention_mask=torch.ones(rows, ids.shape[1], dtype=torch.long, device=device),
            use_cache=True,
            **{name: cache},
        )
    logits = output_logits(loaded, out.last_hidden_state[:, -1])
    return torch.softmax(logits, -1)[:, prompt.answer].double().cpu()


def indirect_effects(
    loaded: LoadedModel,
    corrupted: Sequence[Prompt],
    means: torch.Tensor,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """``[N, L, H]``: per corrupted prompt, each head's gain in the answer's probability when patched."""
    layers = attention_layers(loaded)
    L, H = loaded.layout.n_layers, loaded.layout.n_heads
    out = torch.zeros(len(corrupted), L, H, dtype=torch.float64)
    # Rows per forward pass: a model with many heads patches a few layers at a time.
    per_pass = max(1, 512 // H)
    with prepared(loaded), torch.inference_mode():
        for n, prompt in enumerate(corrupted):
            for start in range(0, len(layers), per_pass):
                chunk = layers[start : start + per_pass]
                probs = _patched_probs(loaded, prompt, means, chunk)
                out[n, chunk] = (probs[:-1] - probs[-1]).reshape(len(chunk), H)
            if progress is not None:
                progress(1)
    return out


# --- the analysis ------------------------------------------------------------------------------------------


def parse_shots(value: str) -> list[int]:
    try:
        shots = sorted({int(s) for s in str(value).split(",") if s.strip()})
    except ValueError:
        raise InputError(
            f"{spelled('shots', value)}: give shot counts separated by commas, e.g. 0,1,5,10"
        ) from None
    if not shots or min(shots) < 0:
        raise InputError(f"{spelled('shots', value)}: give shot counts of 0 or more, e.g. 0,1,5,10")
    return shots


def _task_specs(value: str) -> list[str] | None:
    """None = every shipped task; [] = none."""
    text = str(value).strip()
    if text == "all":
        return None
    if text == "none":
        return []
    return [s.strip() for s in text.split(",") if s.strip()]


def _check_task_specs(value: str) -> None:
    """An empty list is refused: "" read as no tasks would leave out the few-shot part unasked."""
    if not [s for s in str(value).split(",") if s.strip()]:
        raise InputError(
            f"--tasks {value!r} names no task",
            hint="give all, none, or shipped task names and YAML files, comma-separated",
        )


@dataclass(kw_only=True)
class ICLOptions(Stats):
    text: Path | None = option(
        None,
        "Texts for the ICL score (UTF-8; texts are paragraphs separated by blank lines, each cut into "
        "--context-token windows). Default: the shipped English and Chinese haystacks.",
    )
    context: int = option(512, "Tokens per text window for the loss curve.", min=8)
    early: int = option(50, "The ICL score's early token (Olsson et al.: 50).", min=1)
    late: int = option(
        500,
        "The ICL score's late token (Olsson et al.: 500); the nearest the texts allow when shorter.",
        min=2,
    )
    window: int = option(
        5,
        "Average the loss over tokens p-W..p+W around each end (0: single tokens, as Olsson et al.).",
        min=0,
    )
    tasks: str = option(
        "all",
        "Few-shot tasks: all (the shipped ones in configs/icl/), none, or shipped names and YAML files, comma-separated.",
        check=lambda value: _check_task_specs(value),
    )
    shots: str = option("0,1,5,10", "Shot counts for few-shot accuracy, comma-separated.")
    queries: int = option(40, "Queries per task (each with its own drawn demonstrations).", min=2)
    fv: bool = option(
        True,
        "Function-vector heads (AIE) and the function vector's transfer to zero-shot prompts.",
        flag="--fv/--no-fv",
    )
    fv_prompts: int = option(10, "Clean prompts (means) and corrupted prompts (AIE) per task.", min=2)
    fv_shots: int = option(10, "Demonstrations in the AIE's clean and corrupted prompts.", min=1)
    min_accuracy: float = option(
        0.2,
        "A task joins the AIE when the model's accuracy on its clean prompts is at least this.",
        min=0.0,
        max=1.0,
    )
    k: int = option(10, "K: heads in the function vector, and in each set --verify ablates.", min=1)
    verify: bool = option(
        False,
        "Ablate (mean output) the top-K induction heads, the top-K FV heads and K random heads of the "
        "same layers: the change in the ICL score and in few-shot accuracy.",
        flag="--verify/--no-verify",
    )
    draws: int = option(3, HELP_DRAWS, min=1)
    batch_size: int = option(8, HELP_BATCH, min=1)


@dataclass
class ICLInputs:
    texts: list[tuple[str, str]]
    tasks: list[ICLTask]
    shots: list[int]


def _check_positions(options: ICLOptions) -> None:
    """Refuse an early token, late token, window and context that leave no late token to compare
    with (the texts can only shorten the windows; see :func:`icl_score`)."""
    late = min(options.late, options.context - options.window)
    early = max(options.early, 1 + options.window)
    if late - options.window <= early + options.window:
        short = options.context - options.window < options.late
        which = spelled("context", options.context) if short else spelled("late", options.late)
        raise InputError(
            f"{which} leaves no late token to compare with {spelled('early', options.early)} over "
            f"{spelled('window', options.window)}: the late token must come more than "
            f"{2 * options.window} tokens after token {early}",
            hint="give a larger --context or --late, or a smaller --early or --window"
            if ENTRY.get() == "cli"
            else "give a larger context= or late=, or a smaller early= or window=",
        )


def _check_pairs(name: str, usable: int, total: int, shots: list[int], options: ICLOptions) -> None:
    """A k-shot prompt holds k demonstrations and a query, each a different pair of the task: a
    shot count the task cannot fill is refused (a reported k-shot accuracy has k demonstrations)."""
    have = (
        f"{usable} usable pairs (of {total}: the others' answers are not one token for this tokenizer)"
        if usable < total
        else f"{usable} pairs"
    )
    most = usable - 1
    if max(shots) > most:
        raise InputError(
            f"{spelled('shots', options.shots)}: task '{name}' has {have}, so its prompts hold at most "
            f"{most} demonstrations beside the query",
            hint=f"ask for {most} shots or fewer, or add pairs to the task",
        )
    if not (options.fv and options.tasks != "none"):
        return
    if options.fv_shots > most:
        raise InputError(
            f"{spelled('fv_shots', options.fv_shots)}: task '{name}' has {have}, so its prompts hold at "
            f"most {most} demonstrations beside the query",
            hint=f"give {spelled('fv_shots', most)} or less, or add pairs to the task",
        )
    if options.fv_prompts >= usable:
        raise InputError(
            f"{spelled('fv_prompts', options.fv_prompts)}: task '{name}' has {have}; the AIE's "
            "shuffled-label prompts need queries other than the clean prompts' ones",
            hint=f"give {spelled('fv_prompts', max(2, usable // 2))}, or add pairs to the task",
        )


def _progress(progress: ProgressFactory | None, name: str, total: int) -> Callable[[int], None]:
    return progress(name, total) if progress else (lambda _n: None)


def run_icl(
    loaded: LoadedModel, options: ICLOptions, inputs: ICLInputs, progress: ProgressFactory | None
) -> Outcome:
    notes: list[str] = []
    seed, resamples = options.seed, options.resamples
    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError(
            "icl measures next-token loss and answers, so it needs a causal language model with an LM head"
        )
    # 1. the ICL score
    needed = min(options.context, options.late + options.window)
    sequences, specials, names = text_windows(loaded, inputs.texts, options.context, needed, notes=notes)
    # Texts too short for the score are refused here, before the forward passes (icl_score would).
    if not sequences:
        raise InputError("the texts hold no tokens for this tokenizer", hint="give other texts (--text)")
    shortest = min(sum(not special for special in row) for row in specials)
    score_positions(1, shortest, options.early, options.late, options.window)
    advance = _progress(progress, "texts", 1)
    losses = text_losses(loaded, sequences, specials, options.context, options.batch_size)
    advance(1)
    score = icl_score(losses, options.early, options.late, options.window, resamples, seed)
    # 2. few-shot accuracy
    strict = _task_specs(options.tasks) is not None
    tasks, dropped, left_out = prepare_tasks(loaded, inputs.tasks, options.queries, seed, strict=strict)
    for name in left_out:
        notes.append(f"{name}: left out, fewer than 12 of its answers are one token for this tokenizer")
    for name, count in dropped.items():
        if count and name not in left_out:
            notes.append(
                f"{name}: {count} pair(s) left out, their answer is not one token for this tokenizer"
            )
    for data in tasks:
        if len(data.queries) < options.queries:
            notes.append(
                f"{data.task.name}: {len(data.queries)} queries, one per usable pair "
                f"(asked {spelled('queries', options.queries)})"
            )
    accuracy: list[ShotAccuracy] = []
    per_shot: dict[int, list[np.ndarray]] = {}
    if tasks:
        advance = _progress(progress, "few-shot", len(tasks) * len(inputs.shots))
        for data in tasks:
            for shots in inputs.shots:
                correct, _ = answer_probs(
                    loaded, build_prompts(loaded, data, shots, seed), options.batch_size
                )
                accuracy.append(ShotAccuracy(data.task.name, shots, Estimate.of(correct, resamples, seed)))
                per_shot.setdefault(shots, []).append(correct)
                advance(1)
        for shots in inputs.shots:
            pooled = np.concatenate(per_shot[shots])
            accuracy.append(ShotAccuracy("all", shots, Estimate.of(pooled, resamples, seed)))
    # 3. induction heads (the repeated-random-tokens protocol) and function-vector heads
    spec = RepeatSpec(seq_len=50, repeats=2, n_seqs=16, seed=seed)
    repeated = induction(loaded, spec, batch_size=16, n_resamples=resamples, progress=progress)
    results = [r for r in repeated.results if r.detector == "induction"]
    fv_tasks: list[str] = []
    transfer = None
    means: dict[str, TaskMeans] = {}
    if options.fv and tasks:
        fv_result, fv_tasks, means = function_vector_heads(loaded, tasks, options, progress, notes)
        if fv_result is not None:
            results.append(fv_result)
    table = assign_roles(head_table(results, loaded.layout, loaded.name, n_resamples=resamples, seed=seed))
    if fv_tasks:
        transfer = function_vector_transfer(loaded, tasks, fv_tasks, means, table, options, progress)
    measures = ICLMeasures(loaded.name, score, names, accuracy, fv_tasks, transfer, dropped)
    descriptions = {
        "repeated-tokens": f"{spec.n_seqs} random sequences of {spec.seq_len} tokens, repeated once",
        FV_DATA: "few-shot tasks "
        + ", ".join(fv_tasks)
        + f": {options.fv_prompts} shuffled-label prompts each, patched with each head's clean mean",
    }
    report = Report(
        loaded.name,
        table,
        report_sections(results, descriptions),
        loaded.capture_mode,
        notes=notes + uncertainty_notes(results, resamples),
        results=results,
        layout=loaded.layout,
    )
    report.measures = {
        "icl_score": score.score.mean,
        "icl_score_low": score.score.ci[0],
        "icl_score_high": score.score.ci[1],
    }
    if tasks:
        top_shot = max(inputs.shots)
        overall = measures.overall(top_shot)
        if overall is not None:
            report.measures[f"accuracy_{top_shot}_shot"] = overall.mean
    state = {
        "measures": measures,
        "tasks": tasks,
        "windows": (sequences, specials),
        "means": means,
        "rule": RoleRule(),
    }
    return Outcome(report, state=state, checks=[Check("icl", measures)])


def function_vector_heads(
    loaded: LoadedModel,
    tasks: list[TaskData],
    options: ICLOptions,
    progress: ProgressFactory | None,
    notes: list[str],
) -> tuple[DetectorResult | None, list[str], dict[str, TaskMeans]]:
    """The AIE of every head over the tasks the model can do (Todd et al.'s protocol), as a table."""
    seed = options.seed
    means: dict[str, TaskMeans] = {}
    effects: list[torch.Tensor] = []
    chosen: list[str] = []
    advance = _progress(progress, "FV heads", len(tasks))
    for data in tasks:
        # The clean prompts' queries and the corrupted prompts' queries are different pairs.
        order = list(range(len(data.pairs)))
        random.Random(f"{seed}:fv:{data.task.name}").shuffle(order)
        clean_q, corrupt_q = order[: options.fv_prompts], order[options.fv_prompts : 2 * options.fv_prompts]
        clean = build_prompts(loaded, data, options.fv_shots, seed + 1, queries=clean_q)
        found = task_means(loaded, clean, options.batch_size)
        means[data.task.name] = found
        advance(1)
        accuracy = float(found.correct.mean())
        if accuracy < options.min_accuracy:
            notes.append(
                f"{data.task.name}: clean {options.fv_shots}-shot accuracy {accuracy:.2f} < "
                f"{spelled('min_accuracy', options.min_accuracy)}; left out of the AIE"
            )
            continue
        if len(corrupt_q) < options.fv_prompts:
            # check_loaded refuses a task with none; fewer than asked is said, not hidden
            notes.append(
                f"{data.task.name}: {len(corrupt_q)} shuffled-label prompts, not "
                f"{spelled('fv_prompts', options.fv_prompts)}: its {len(data.pairs)} usable pairs leave "
                f"{len(corrupt_q)} queries besides the {len(clean_q)} clean prompts'"
            )
        if not corrupt_q:
            continue
        corrupted = build_prompts(loaded, data, options.fv_shots, seed + 2, shuffled=True, queries=corrupt_q)
        tick = _progress(progress, f"AIE {data.task.name}", len(corrupted))
        effects.append(indirect_effects(loaded, corrupted, found.raw, tick))
        chosen.append(data.task.name)
    if not effects:
        notes.append(
            f"no task reached {spelled('min_accuracy', options.min_accuracy)}: no function-vector heads"
        )
        return None, [], means
    sums = torch.cat(effects)  # [N, L, H]: every corrupted prompt of every chosen task
    n = sums.shape[0]
    result = DetectorResult(
        "fv",
        "aie",
        "",
        sums,
        torch.ones(n, dtype=torch.float64),
        torch.zeros(n, dtype=torch.float64),
        "zero",
        FV_DATA,
    )
    return result, chosen, means


def _vector(means: TaskMeans, heads: Sequence[Head]) -> torch.Tensor:
    return sum(
        (means.writes[layer, head] for layer, head in heads),
        torch.zeros(means.writes.shape[-1], dtype=torch.float64),
    )


def _random_heads(
    heads: Sequence[Head], excluded: set[Head], n_heads: int, rng: random.Random, k: int
) -> list[Head]:
    """K random heads, each from the layer of a head in ``heads`` (drawn with replacement), none excluded."""
    layers = [layer for layer, _ in heads]
    taken = set(excluded)
    chosen: list[Head] = []
    for _ in range(k):
        for _try in range(100):
            layer = rng.choice(layers)
            free = [(layer, h) for h in range(n_heads) if (layer, h) not in taken]
            if free:
                pick = rng.choice(free)
                chosen.append(pick)
                taken.add(pick)
                break
        else:
            raise InputError("no heads are left to draw a random control from; lower --k")
    return sorted(chosen)


def function_vector_transfer(
    loaded: LoadedModel,
    tasks: list[TaskData],
    fv_tasks: list[str],
    means: dict[str, TaskMeans],
    table: Any,
    options: ICLOptions,
    progress: ProgressFactory | None,
) -> Transfer:
    """Zero-shot accuracy with the function vector added after one layer: the layer chosen on half of
    each task's queries, the accuracy reported on the other half, against K random heads' vector."""
    seed, k = options.seed, options.k
    heads = top_heads(table[table.data == FV_DATA], "fv", k)
    chosen = [t for t in tasks if t.task.name in fv_tasks]
    halves = {t.task.name: (t.queries[::2], t.queries[1::2]) for t in chosen}
    layers = attention_layers(loaded)
    advance = _progress(progress, "FV layers", len(layers) + 2 + options.draws)

    def accuracy(half: int, vectors: dict[str, torch.Tensor] | None, layer: int) -> np.ndarray:
        prompts, rows = [], []
        for data in chosen:
            prompts += build_prompts(loaded, data, 0, seed + 3, queries=halves[data.task.name][half])
            if vectors is not None:
                rows += [vectors[data.task.name]] * len(halves[data.task.name][half])
        steer = (layer, torch.stack(rows)) if vectors is not None else None
        correct, _ = answer_probs(loaded, prompts, options.batch_size * 4, steer=steer)
        advance(1)
        return correct

    fv = {name: _vector(means[name], heads) for name in fv_tasks}
    sweep = [(layer, float(accuracy(0, fv, layer).mean())) for layer in layers]
    best = max(sweep, key=lambda item: item[1])[0]
    resamples = options.resamples
    zero = accuracy(1, None, best)
    with_fv = accuracy(1, fv, best)
    rng = random.Random(seed)
    draws = []
    for _ in range(options.draws):
        control = _random_heads(heads, set(heads), loaded.layout.n_heads, rng, len(heads))
        draws.append(accuracy(1, {name: _vector(means[name], control) for name in fv_tasks}, best))
    pooled = np.mean(np.stack(draws), 0)
    return Transfer(
        k,
        heads,
        best,
        sweep,
        Estimate.of(zero, resamples, seed),
        Estimate.of(with_fv, resamples, seed),
        Estimate.of(pooled, resamples, seed),
        [float(d.mean()) for d in draws],
    )


# --- --verify: which heads matter for which ICL ----------------------------------------------------------------


def ablation_sets(
    table: Any, k: int, n_heads: int, draws: int, seed: int
) -> tuple[dict[str, list[Head]], list[Head], list[list[Head]]]:
    """Top-K induction and top-K FV heads, heads top-K in both left out of both (Yin and Steinhardt),
    and ``draws`` sets of K random heads from the same layers as the two lists, in neither."""
    induction_rank = top_heads(table[table.detector == "induction"], "induction", len(table))
    fv_rank = top_heads(table[table.data == FV_DATA], "fv", len(table))
    # Heads top-K in both lists are left out of both; the lists refill from their rankings, and a
    # head that then lands in both is left out too, until the two lists share no head.
    excluded: set[Head] = set()
    while True:
        sets = {
            "induction": [h for h in induction_rank if h not in excluded][:k],
            "fv": [h for h in fv_rank if h not in excluded][:k],
        }
        shared = set(sets["induction"]) & set(sets["fv"])
        if not shared:
            break
        excluded |= shared
    both = sorted(excluded)
    rng = random.Random(seed)
    union = sets["induction"] + sets["fv"]
    excluded = set(union) | set(both)
    random_sets = [_random_heads(union, excluded, n_heads, rng, k) for _ in range(draws)]
    return sets, both, random_sets


def verify_icl(
    loaded: LoadedModel, outcome: Outcome, options: ICLOptions, progress: ProgressFactory | None
) -> ICLAblation:
    measures: ICLMeasures = outcome.state["measures"]
    tasks: list[TaskData] = outcome.state["tasks"]
    table = outcome.report.table
    if measures.score is None:
        raise InputError("--verify needs the ICL score")
    if not (table.detector == "fv").any():
        raise InputError(
            "--verify compares induction heads with function-vector heads, and none were found",
            hint="drop --no-fv, or lower --min-accuracy",
        )
    seed, resamples, k = options.seed, options.resamples, options.k
    sets, both, random_sets = ablation_sets(table, k, loaded.layout.n_heads, options.draws, seed)
    sequences, specials = outcome.state["windows"]
    shots = options.fv_shots
    prompts = [
        p
        for data in tasks
        if data.task.name in measures.fv_tasks
        for p in build_prompts(loaded, data, shots, seed)
    ]
    every = sorted({h for heads in [*sets.values(), *random_sets] for h in heads})
    advance = _progress(progress, "ablations", 2 + 2 * (2 + len(random_sets)))
    text_means = capture.head_output_means(
        loaded, model_batches(loaded, sequences, specials, options.batch_size), every
    )
    advance(1)
    prompt_batches = model_batches(
        loaded, [p.ids for p in prompts], [[False] * len(p.ids) for p in prompts], options.batch_size
    )
    prompt_means = capture.head_output_means(loaded, prompt_batches, every)
    advance(1)
    score = measures.score

    def per_text(ablation: capture.Ablation | None) -> np.ndarray:
        loss = (
            score.per_text_loss
            if ablation is None
            else text_losses(
                loaded, sequences, specials, options.context, options.batch_size, ablation=ablation
            )
        )
        w = score.window
        late = loss[:, score.late - 1 - w : score.late + w].mean(1)
        early = loss[:, score.early - 1 - w : score.early + w].mean(1)
        advance(1)
        return late - early

    def per_prompt(ablation: capture.Ablation | None) -> np.ndarray:
        correct, _ = answer_probs(loaded, prompts, options.batch_size, ablation=ablation)
        advance(1)
        return correct.astype(float)

    clean = {"icl_score": score.per_text, "accuracy": per_prompt(None)}
    cells: dict[str, dict[str, AblationCell]] = {"icl_score": {}, "accuracy": {}}

    def record(name: str, values: dict[str, np.ndarray]) -> None:
        for measure, value in values.items():
            cells[measure][name] = AblationCell(
                Estimate.of(value, resamples, seed), Estimate.of(value - clean[measure], resamples, seed)
            )

    for name, heads in sets.items():
        record(
            name,
            {
                "icl_score": per_text(capture.Ablation.of(heads, "mean", text_means)),
                "accuracy": per_prompt(capture.Ablation.of(heads, "mean", prompt_means)),
            },
        )
    draws_text = [per_text(capture.Ablation.of(h, "mean", text_means)) for h in random_sets]
    draws_prompt = [per_prompt(capture.Ablation.of(h, "mean", prompt_means)) for h in random_sets]
    record("random", {"icl_score": np.mean(draws_text, 0), "accuracy": np.mean(draws_prompt, 0)})
    return ICLAblation(
        k,
        "mean",
        shots,
        sets,
        both,
        random_sets,
        {name: Estimate.of(values, resamples, seed) for name, values in clean.items()},
        cells,
    )


@register
class ICL(Analysis):
    name = "icl"
    summary = (
        "In-context learning beside its heads: the ICL score (loss by position), few-shot accuracy, "
        "function-vector heads, and (--verify) which heads' removal costs which."
    )
    options = ICLOptions
    takes_capture = False
    json_roles = True
    sweepable = True
    spaced_checks = True
    outputs = (
        Output("--png", "Write the loss by token position (log x) as a PNG (atomic).", icl_png, first=True),
        Output(
            "--html",
            "Write a self-contained HTML report (role map with ind and fv, head tables).",
            html_report,
        ),
    )

    def sweep_panels(self, losses: Any) -> list[Any]:
        """The sweep plot's ICL panel (drawn beside the role tables by ``headscope sweep --png``)."""
        from .icl_present import sweep_panels

        return sweep_panels(losses)

    def check(self, options: ICLOptions) -> ICLInputs:
        from headscope.extend.protocol import check_common

        check_common(options)
        shots = parse_shots(options.shots)
        if options.late <= options.early:
            raise InputError(
                f"{spelled('late', options.late)} must be after {spelled('early', options.early)}"
            )
        _check_positions(options)
        if options.text is not None:
            path = Path(options.text)
            texts = [(f"{path}:{i + 1}", t) for i, t in enumerate(read_texts(path))]
        else:
            texts = default_texts()
        specs = _task_specs(options.tasks)
        tasks = [] if specs == [] else load_tasks(specs)
        for task in tasks:  # the pairs in the file; check_loaded counts those this tokenizer can use
            _check_pairs(task.name, len(task.pairs), len(task.pairs), shots, options)
        if options.verify and not (options.fv and tasks):
            raise InputError(
                "--verify compares induction with function-vector heads", hint="keep --fv and some --tasks"
            )
        return ICLInputs(texts, tasks, shots)

    def check_loaded(self, loaded: Any, options: ICLOptions) -> None:
        if not (loaded.is_causal and loaded.has_lm_head):
            raise InputError(
                "icl measures next-token loss and answers, so it needs a causal language model with an LM head"
            )
        if options.fv and options.tasks != "none":
            too_many(loaded, options.k, "k", "a random control of the same size")
        # Each task's answers must be single tokens for this tokenizer, and each task must hold the
        # demonstrations asked for: refused before any forward pass.
        specs = _task_specs(options.tasks)
        if specs != []:
            found, _, _ = prepare_tasks(
                loaded, load_tasks(specs), options.queries, options.seed, strict=specs is not None
            )
            shots = parse_shots(options.shots)
            for data in found:
                _check_pairs(data.task.name, len(data.pairs), len(data.task.pairs), shots, options)
        _check_context(loaded, options.context)

    def views(self, loaded: Any, options: ICLOptions) -> tuple[str, ...]:
        # The function vector is a sum of heads' writes: the per-head decomposition is checked first.
        return ("maps", "dla") if options.fv and options.tasks != "none" else ("maps",)

    def run(self, loaded: Any, options: ICLOptions, prepared: ICLInputs, progress: Any) -> Outcome:
        return run_icl(loaded, options, prepared, progress)

    def verify(
        self, loaded: Any, outcome: Outcome, options: ICLOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        if k is not None:
            options = ICLOptions(**{**options.__dict__, "k": k})
        return [*outcome.checks, Check("icl-ablation", verify_icl(loaded, outcome, options, progress))]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {
            "role_rule": outcome.state["rule"].describe(),
            "icl": one_check(outcome, "icl"),
            "ablation": one_check(outcome, "icl-ablation"),
        }

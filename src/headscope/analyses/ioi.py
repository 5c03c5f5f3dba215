"""``ioi``: the indirect-object-identification circuit (Wang et al. 2022) in any causal LM.

Each prompt ends where the indirect object (IO) is predicted: "When Mary and John went to the
store, John gave a drink to" → " Mary"; the subject (S) occurs twice (S1, S2). Per head, at the
last token (END):

* attention to IO, S1 and S2 (summed over each name's tokens), against uniform attention;
* direct logit attribution toward IO against S: the head's write at END through the final
  norm (its statistic frozen at the actual residual) onto ``W_U[IO] - W_U[S]``;
* S-inhibition: path patching from the head's output at END in the corrupted run (ABC: S2
  replaced by a third name) into the name movers' *queries* only, keys and values clean. The score
  is how much the name movers' attention preference for IO over S (attention to IO minus
  attention to S1 and S2, averaged over the name movers in later layers) drops. Senders are all
  heads in layers before the last name mover's layer; a sender only reaches name movers in later
  layers.

The model-level result is the IOI accuracy (logit IO > logit S at END) and the mean logit
difference, each over the prompts, with a 95% bootstrap interval. Names are compared by their
first token in context; how many names are one token is reported.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope import capture
from headscope.capture.dla import HeadWrites, attention_layers
from headscope.capture.logits import output_logits_of
from headscope.capture.patching import BlockInputs, BlockRecorder, record_block_inputs, rerun_block
from headscope.data.circuits import IOISet, load_ioi, occurrences
from headscope.data.prompts import builtin, display_path
from headscope.detectors.base import DetectorResult
from headscope.detectors.circuits import IOIAttentionDetector
from headscope.errors import InputError
from headscope.extend.base import ProgressFactory, Report, check_context, pad_token_of, report_sections
from headscope.extend.checks import Check, one_check
from headscope.extend.protocol import (
    HELP_ABLATION,
    HELP_BATCH,
    HELP_DRAWS,
    Analysis,
    Outcome,
    Stats,
    check_common,
    option,
    register,
)
from headscope.models import LoadedModel
from headscope.verdicts.heads import random_control
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import RoleRule, assign_roles
from headscope.verdicts.stats import bootstrap_ratio_ci, check_resamples

Head = tuple[int, int]

# Rows (copies of a batch) per replay of a receiver block in path patching: bounds its memory.
PATCH_ROWS = 1024


@dataclass
class IOIPrompt:
    ids: list[int]
    special: list[bool]
    end: int
    targets: dict[str, list[int]]
    io_id: int
    s_id: int


@dataclass
class IOIOutcome:
    """The model's own answer: is the logit of IO above that of S at the last token?"""

    data: str
    n: int
    accuracy: float
    accuracy_ci: tuple[float, float]
    logit_diff: float
    logit_diff_ci: tuple[float, float]
    names: int
    single_token_names: int
    diffs: torch.Tensor = field(repr=False)

    def print_block(self, report: Any, section: Any, console: Any, top: int) -> None:
        """This prompt set's IOI tables for people, as one block (accuracy, heads, captions)."""
        from .ioi_present import print_ioi_sections

        print_ioi_sections(report, section, console, top)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "ioi",
            "n": self.n,
            "accuracy": self.accuracy,
            "accuracy_ci": list(self.accuracy_ci),
            "logit_diff": self.logit_diff,
            "logit_diff_ci": list(self.logit_diff_ci),
            "names": self.names,
            "single_token_names": self.single_token_names,
        }


@dataclass
class IOIVerification:
    """Ablate the name movers, and as many random same-layer heads; compare the logit difference."""

    data: str
    mode: str
    heads: list[Head]
    random_heads: list[list[Head]]
    clean: float
    ablated: float
    random: float

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope ioi --verify``)."""
        from .ioi_present import print_ioi_verification

        print_ioi_verification(self, console)

    def to_json(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "mode": self.mode,
            "heads": [list(h) for h in self.heads],
            "random_heads": [[list(h) for h in d] for d in self.random_heads],
            "clean_logit_diff": self.clean,
            "ablated_logit_diff": self.ablated,
            "random_logit_diff": self.random,
        }


def _sep(name: str) -> str:
    """What separates the prompt from the name: a space, except before CJK characters."""
    return "" if ord(name[0]) >= 0x2E80 else " "


def _first_token(tokenizer: Any, text: str, prompt_ids: list[int], name: str) -> tuple[int, bool]:
    """The name's first token as the model would predict it after ``text``, and whether the
    name is one token there."""
    full = tokenizer(text + _sep(name) + name, add_special_tokens=True)["input_ids"]
    if full[: len(prompt_ids)] == prompt_ids and len(full) > len(prompt_ids):
        extra = full[len(prompt_ids) :]
        return int(extra[0]), len(extra) == 1
    alone = tokenizer(_sep(name) + name, add_special_tokens=False)["input_ids"]
    return int(alone[0]), len(alone) == 1


def _token_positions(
    offsets: Sequence[tuple[int, int]], special: Sequence[bool], span: tuple[int, int]
) -> list[int]:
    start, end = span
    return [i for i, (a, b) in enumerate(offsets) if not special[i] and b > a and a < end and start < b]


def encode_ioi(
    loaded: LoadedModel, ioi_set: IOISet, seed: int = 0
) -> tuple[list[IOIPrompt], list[IOIPrompt], dict[str, bool]]:
    """Clean prompts, their ABC corruptions, and for each name whether it is a single token."""
    tokenizer = loaded.tokenizer
    pool = sorted({name for item in ioi_set.items for name in (item.io, item.s)})
    rng = random.Random(seed)
    clean, corrupt = [], []
    single: dict[str, bool] = {}
    for item in ioi_set.items:
        others = [n for n in pool if n not in {item.io, item.s} and _sep(n) == _sep(item.s)]
        if not others:
            raise InputError(
                f"{item.source}: item '{item.id}': no third name to build the corrupted prompt from",
                hint="the set needs at least three names",
            )
        s_spans = occurrences(item.text, item.s)
        a, b = s_spans[1]
        third = rng.choice(others)
        for text, replaced in ((item.text, False), (item.text[:a] + third + item.text[b:], True)):
            enc = tokenizer(
                text, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True
            )
            ids = list(enc["input_ids"])
            special = [bool(s) for s in enc["special_tokens_mask"]]
            offsets = [tuple(o) for o in enc["offset_mapping"]]
            check_context(loaded, len(ids), f"{item.source}: item '{item.id}'")
            io_id, io_single = _first_token(tokenizer, text, ids, item.io)
            s_id, s_single = _first_token(tokenizer, text, ids, item.s)
            if io_id == s_id:
                raise InputError(
                    f"{item.source}: item '{item.id}': IO '{item.io}' and S '{item.s}' begin with the same token",
                    hint="choose names whose first tokens differ",
                )
            single.setdefault(item.io, io_single)
            single.setdefault(item.s, s_single)
            spans = {
                "io": occurrences(text, item.io)[0],
                "s1": s_spans[0],
                "s2": (a, a + len(third)) if replaced else s_spans[1],
            }
            targets = {key: _token_positions(offsets, special, span) for key, span in spans.items()}
            empty = [key for key, positions in targets.items() if not positions]
            if empty:
                raise InputError(f"{item.source}: item '{item.id}': no tokens for {', '.join(empty)}")
            prompt = IOIPrompt(ids, special, len(ids) - 1, targets, io_id, s_id)
            (corrupt if replaced else clean).append(prompt)
    return clean, corrupt, single


def _batches(loaded: LoadedModel, prompts: list[IOIPrompt], order: list[list[int]]) -> list[capture.Batch]:
    """Batches with the given rows, so that clean and corrupted batches pair up row by row."""
    out = []
    for rows in order:
        part = capture.make_batches(
            [prompts[i].ids for i in rows],
            [prompts[i].special for i in rows],
            batch_size=len(rows),
            pad_id=pad_token_of(loaded),
            is_causal=loaded.is_causal,
            meta=[
                {
                    "end": prompts[i].end,
                    "targets": prompts[i].targets,
                    "io_id": prompts[i].io_id,
                    "s_id": prompts[i].s_id,
                }
                for i in rows
            ],
            sort_by_length=False,
        )[0]
        part.example_index = torch.as_tensor(rows, dtype=torch.long)
        out.append(part)
    return out


def _ends(batch: capture.Batch) -> torch.Tensor:
    return torch.as_tensor([m["end"] for m in batch.meta], dtype=torch.long)


def _names(batch: capture.Batch) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.as_tensor([m["io_id"] for m in batch.meta], dtype=torch.long),
        torch.as_tensor([m["s_id"] for m in batch.meta], dtype=torch.long),
    )


def _logit_diffs(loaded: LoadedModel, hidden: torch.Tensor, batch: capture.Batch) -> torch.Tensor:
    """[B] logit(IO) - logit(S) at END, from the final hidden states (soft-capped as the model does)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    at = hidden[rows, _ends(batch).to(hidden.device)]
    logits = output_logits_of(loaded, at, torch.stack(_names(batch), dim=1))  # only IO's and S's
    return (logits[:, 0] - logits[:, 1]).double().cpu()


def _mean_ci(values: torch.Tensor, n_resamples: int, seed: int) -> tuple[float, tuple[float, float]]:
    n = len(values)
    if n_resamples == 0:
        return float(values.mean()), (float("nan"), float("nan"))
    low, high = bootstrap_ratio_ci(
        values[:, None], torch.ones(n, dtype=torch.float64), n_resamples=n_resamples, seed=seed
    )
    return float(values.mean()), (float(low[0]), float(high[0]))


def _name_movers(table: Any, data: str, role: str) -> list[Head]:
    rows = table[(table.data == data) & (table.role == role) & (table.relation == "dla")]
    return [(int(r.layer), int(r.head)) for r in rows.itertuples()]


@dataclass
class CleanRecord:
    """What path patching needs from one clean batch, kept by the main clean pass: each possible
    receiver block's input at END, keys and values, and each possible sender's write at END."""

    blocks: dict[int, BlockInputs] = field(repr=False)
    writes: dict[int, torch.Tensor] = field(repr=False)  # layer -> [B, H, D]


def patching_reads(loaded: LoadedModel) -> tuple[HeadWrites, BlockRecorder]:
    """The main clean pass's reads when path patching follows: the heads' writes at END (with DLA
    toward IO against S) kept for every possible sender, and every possible receiver block's input
    at END with its keys and values. The receivers are known only once this pass is scored."""
    layers = attention_layers(loaded)
    writes = HeadWrites(loaded, _ends, _names, keep=set(layers[:-1]))
    return writes, BlockRecorder(loaded, layers[1:], positions_of=_ends)


def s_inhibition(
    loaded: LoadedModel,
    clean: list[capture.Batch],
    corrupt: list[capture.Batch],
    receivers: Sequence[Head],
    n_examples: int,
    data: str,
    progress: ProgressFactory | None = None,
    recorded: Sequence[CleanRecord] | None = None,
) -> DetectorResult:
    """Path patching from every earlier head's output at END (corrupted run) into the receivers' queries.

    ``recorded`` (one per clean batch, from the main clean pass: :func:`patching_reads`) holds the
    receivers' block inputs and the senders' clean writes; without it each clean batch runs again
    to record them. Either way the numbers are the same (to float noise)."""
    layout = loaded.layout
    by_layer: dict[int, list[int]] = {}
    for layer, head in receivers:
        by_layer.setdefault(layer, []).append(head)
    last = max(by_layer)
    senders = set(range(last))
    sums = torch.zeros(n_examples, layout.n_layers, layout.n_heads, dtype=torch.float64)
    counts = torch.zeros(n_examples, dtype=torch.float64)
    reached = torch.zeros(layout.n_layers, dtype=torch.float64)  # receivers after each sender layer
    for layer in range(layout.n_layers):
        reached[layer] = sum(len(h) for r, h in by_layer.items() if r > layer)
    advance = progress(f"{data}: path patching", len(clean)) if progress else None
    corrupted = HeadWrites(loaded, _ends, keep=senders)
    for index, (clean_batch, corrupt_batch) in enumerate(zip(clean, corrupt, strict=True)):
        ends_clean = _ends(clean_batch)
        # The senders' writes are all this pass is for: it ends after the last sender layer.
        capture.run(loaded, [corrupt_batch], capture.Pass(reads=[corrupted], stop_after=last - 1))
        if recorded is not None:
            inputs, clean_kept = recorded[index].blocks, recorded[index].writes
        else:
            clean_writes = HeadWrites(loaded, lambda b, e=ends_clean: e, keep=senders)
            inputs = record_block_inputs(loaded, clean_batch, by_layer, writes=clean_writes)
            clean_kept = clean_writes.kept
        rows = clean_batch.example_index
        signs = _preference_signs(clean_batch)
        effect = torch.zeros(len(rows), layout.n_layers, layout.n_heads, dtype=torch.float64)
        for receiver_layer, heads in sorted(by_layer.items()):
            sending = [layer for layer in range(receiver_layer) if layer in corrupted.kept]
            if not sending:  # no earlier head to patch: nothing reaches this receiver
                continue
            base = _receiver_preference(
                loaded, receiver_layer, heads, inputs[receiver_layer], clean_batch, signs, None
            )
            # Every head of several sender layers at once: one copy of the batch per head, at most
            # PATCH_ROWS rows per replay of the receivers' block.
            step = max(1, PATCH_ROWS // (layout.n_heads * len(rows)))
            for start in range(0, len(sending), step):
                chunk = sending[start : start + step]
                delta = torch.cat(
                    [(corrupted.kept[layer] - clean_kept[layer]).transpose(0, 1) for layer in chunk]
                )  # [len(chunk) * H, B, D]
                patched = _receiver_preference(
                    loaded, receiver_layer, heads, inputs[receiver_layer], clean_batch, signs, delta
                )
                effect[:, chunk] += base[:, None, None] - patched.view(
                    len(chunk), layout.n_heads, -1
                ).permute(2, 0, 1)
        sums[rows] += effect / reached.clamp(min=1)[None, :, None]
        counts[rows] += 1.0
        if advance:
            advance(1)
    return DetectorResult(
        "ioi",
        "s-inhibition",
        "patch",
        sums,
        counts,
        torch.zeros(n_examples, dtype=torch.float64),
        "zero",
        data,
    )


def _preference_signs(batch: capture.Batch) -> torch.Tensor:
    """[B, T] float64: +1 at each row's IO tokens, -1 at its S1 and S2 tokens (0 elsewhere)."""
    signs = torch.zeros(len(batch.meta), batch.input_ids.shape[1], dtype=torch.float64)
    for row, meta in enumerate(batch.meta):
        targets = meta["targets"]
        for key, sign in (("io", 1.0), ("s1", -1.0), ("s2", -1.0)):
            for position in targets[key]:
                signs[row, position] += sign
    return signs


def _receiver_preference(
    loaded: LoadedModel,
    layer: int,
    heads: list[int],
    inputs: BlockInputs,
    batch: capture.Batch,
    signs: torch.Tensor,
    delta: torch.Tensor | None,
) -> torch.Tensor:
    """[copies * B] summed over ``heads``: attention from END to IO minus attention to S1 and S2
    (``signs``: :func:`_preference_signs` of ``batch``)."""
    ends = _ends(batch)
    copies = 1 if delta is None or delta.dim() == 2 else delta.shape[0]
    out = torch.zeros(copies * len(ends), dtype=torch.float64)
    chosen = torch.as_tensor(heads, dtype=torch.long)

    def on_layer(_layer: int, attn: torch.Tensor, b: capture.Batch, q_start: int) -> None:
        # Only END's query is computed: one query row per row (copies of the batch side by side).
        weights = attn[:, chosen.to(attn.device), 0].double().sum(1).cpu()  # [copies * B, K']
        out.add_((weights * signs[:, : weights.shape[-1]].repeat(copies, 1)).sum(-1))

    rerun_block(loaded, layer, inputs, batch, delta, ends, on_layer, only_positions=True)
    return out


def ioi(
    loaded: LoadedModel,
    ioi_set: IOISet,
    *,
    batch_size: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    patch: bool = True,
    role_rule: RoleRule | None = None,
    progress: ProgressFactory | None = None,
) -> tuple[Report, IOIOutcome, dict[str, list[capture.Batch]]]:
    """Score every head on an IOI set. Returns the report, the model's outcome, and the batches
    (clean and corrupted, for ``--verify``)."""
    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError(
            "ioi reads the model's prediction of the next name, so it needs a causal language model"
        )
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    check_resamples(n_resamples)
    capture.checks.require(loaded, "dla")
    data = ioi_set.name
    clean_prompts, corrupt_prompts, single = encode_ioi(loaded, ioi_set, seed)
    n = len(clean_prompts)
    order = sorted(range(n), key=lambda i: len(clean_prompts[i].ids))
    groups = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    clean = _batches(loaded, clean_prompts, groups)
    corrupt = _batches(loaded, corrupt_prompts, groups)

    detector = IOIAttentionDetector()
    detector.start(loaded.layout, n)
    # Path patching replays blocks of this clean pass: it keeps what they need as it goes.
    record = patch and loaded.capture_mode == "stream" and len(attention_layers(loaded)) > 1
    writes, blocks = patching_reads(loaded) if record else (HeadWrites(loaded, _ends, _names), None)
    recorded: list[CleanRecord] = []
    dla = torch.zeros(n, loaded.layout.n_layers, loaded.layout.n_heads, dtype=torch.float64)
    diffs = torch.zeros(n, dtype=torch.float64)
    advance = progress(data, n) if progress else None

    def on_hidden(hidden: torch.Tensor, batch: capture.Batch) -> None:
        diffs[batch.example_index] = _logit_diffs(loaded, hidden, batch)

    def on_batch_done(batch: capture.Batch) -> None:
        assert writes.dla is not None
        dla[batch.example_index] = writes.dla
        if blocks is not None:
            recorded.append(CleanRecord(blocks.recorded, writes.kept))
        if advance:
            advance(len(batch.example_index))

    attention = capture.Attention(detector.update, rows=detector.reads, on_layer_done=detector.end_layer)
    capture.run(
        loaded,
        clean,
        capture.Pass(
            reads=[attention, writes, capture.FinalHidden(on_hidden), blocks], on_batch_done=on_batch_done
        ),
    )
    ones = torch.ones(n, dtype=torch.float64)
    results = detector.results(data)
    results.append(
        DetectorResult("ioi", "dla", "io-s", dla, ones, torch.zeros(n, dtype=torch.float64), "zero", data)
    )
    rule = role_rule or RoleRule()
    table = assign_roles(
        head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed), rule
    )
    notes = []
    movers = _name_movers(table, data, "nm")
    if patch and movers and loaded.capture_mode != "stream":
        # Path patching holds the receivers' keys and values, which the streaming function records.
        notes.append(
            f"{data}: no S-inhibition path patching: it needs streaming capture, and this model runs eager"
        )
    elif patch and movers:
        results.append(s_inhibition(loaded, clean, corrupt, movers, n, data, progress, recorded or None))
        table = assign_roles(
            head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed), rule
        )
    elif patch:
        notes.append(f"{data}: no name movers found, so no S-inhibition path patching")

    accuracy, accuracy_ci = _mean_ci((diffs > 0).double(), n_resamples, seed)
    mean_diff, diff_ci = _mean_ci(diffs, n_resamples, seed)
    outcome = IOIOutcome(
        data, n, accuracy, accuracy_ci, mean_diff, diff_ci, len(single), int(sum(single.values())), diffs
    )
    descriptions = {data: f"{display_path(ioi_set.path)} ({n} prompts)"}
    report = Report(
        loaded.name,
        table,
        report_sections(results, descriptions),
        loaded.capture_mode,
        notes=notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs={data: clean, f"{data}:corrupt": corrupt},
        layout=loaded.layout,
        outcomes={data: outcome},
    )
    return report, outcome, {"clean": clean, "corrupt": corrupt}


def verify_ioi(
    loaded: LoadedModel,
    report: Report,
    data: str,
    *,
    mode: str = "zero",
    draws: int = 3,
    seed: int = 0,
) -> IOIVerification | None:
    """Ablate the name movers against random same-layer heads; the mean logit difference of each run."""
    heads = _name_movers(report.table, data, "nm")
    if not heads:
        return None
    batches = report.inputs[data]
    rng = random.Random(seed)
    controls = [random_control(heads, loaded.layout, rng) for _ in range(draws)]
    means = None
    if mode == "mean":
        means = capture.head_output_means(loaded, batches, [*heads, *(h for c in controls for h in c)])

    def mean_diff(ablation: capture.Ablation | None) -> float:
        values: list[torch.Tensor] = []
        hidden = capture.FinalHidden(lambda h, b: values.append(_logit_diffs(loaded, h, b)))
        capture.run(loaded, batches, capture.Pass(reads=[hidden], edits=[ablation]))
        return float(torch.cat(values).mean())

    clean = mean_diff(None)
    ablated = mean_diff(capture.Ablation.of(heads, mode, means))
    random_diffs = [mean_diff(capture.Ablation.of(c, mode, means)) for c in controls]
    return IOIVerification(data, mode, heads, controls, clean, ablated, float(np.mean(random_diffs)))


# --- the analysis: options, check, run, verify, JSON ------------------------------------------------


@dataclass(kw_only=True)
class IOIOptions(Stats):
    data: str | Path | None = option(
        None,
        "IOI prompts, YAML or JSONL: text, io, s (default: the shipped English set).",
        cli_type=Path | None,
    )
    verify: bool = option(
        False, "Ablate the name movers and random same-layer heads; report the logit difference."
    )
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(3, HELP_DRAWS, min=1)
    patch: bool = option(
        True, "Find S-inhibition heads by path patching (the slow part).", flag="--patch/--no-patch"
    )
    batch_size: int = option(8, HELP_BATCH, min=1)


@register
class IOI(Analysis):
    name = "ioi"
    summary = "Indirect object identification: name movers, negative name movers and S-inhibition heads."
    options = IOIOptions
    takes_capture = False

    def check(self, options: IOIOptions) -> IOISet:
        check_common(options)
        return load_ioi(options.data if options.data is not None else builtin("ioi/en.yaml"))

    def run(self, loaded: Any, options: IOIOptions, prepared: IOISet, progress: Any) -> Outcome:
        report, _, _ = ioi(
            loaded,
            prepared,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            patch=options.patch,
            progress=progress,
        )
        return Outcome(report, state={"data": prepared.name})

    def wants_verify(self, options: IOIOptions) -> bool:
        return options.verify

    def verify(
        self, loaded: Any, outcome: Outcome, options: IOIOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        check = verify_ioi(
            loaded,
            outcome.report,
            outcome.state["data"],
            mode=options.ablation,
            draws=options.draws,
            seed=options.seed,
        )
        if check is None:
            outcome.report.notes.append("--verify: no name movers to ablate")
            return []
        return [Check("ioi", check)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"verification": one_check(outcome, "ioi")}

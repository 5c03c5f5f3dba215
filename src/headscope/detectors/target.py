"""Detectors declared, not written: attention mass on target keys, and TransformerLens-style patterns.

Most attention-pattern roles are one question: how much of a query's attention lands on a few
known keys (the previous token, earlier copies of this token, the token after them), against the
share uniform attention would put there. :class:`TargetDetector` is that question as one
declaration; previous-token, duplicate-token and induction are instances of it.

:class:`PatternDetector` scores a head against a whole ``[T, T]`` pattern per prompt, the way
TransformerLens' ``detect_head`` does ("mul": the share of the head's attention on the pattern;
"abs": one minus the mean absolute difference per row), with the same pattern scored on uniform
attention as the reference.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from headscope.capture import Batch
from headscope.capture.rows import Pairs, PairWeights
from headscope.core.registry import origin_in
from headscope.core.rolespec import RoleSpec
from headscope.errors import HeadscopeError, InputError, RunFailure

from .base import Detector

# (rows, queries, keys): one entry per (query, target key), as 1-D long tensors of one length.
Targets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
TargetFn = Callable[[Batch], Targets]
# Where a declared detector is scored: the scan's natural-text set, its repeated random tokens, or
# a prompt set of your own (.yaml, .jsonl or .txt, as `headscope prompts validate` reads them).
BUILTIN_SOURCES = ("text", "repeated-tokens")
PROMPT_SUFFIXES = (".yaml", ".yml", ".jsonl", ".txt")
NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


def check_name(name: Any, what: str = "detector") -> str:
    """A name the CLI can take in a comma list and the CSV can hold: lower case, digits, - and _."""
    if not isinstance(name, str) or not NAME.match(name):
        raise InputError(
            f"{what} name {name!r} is not usable",
            hint="use lower-case letters, digits, '-' and '_', starting with a letter (e.g. 'closing-bracket')",
        )
    return name


def check_source(source: Any, name: str) -> str:
    """``text``, ``repeated-tokens``, or the path of a prompt set (read when the scan runs)."""
    if isinstance(source, Path):
        source = str(source)
    if not isinstance(source, str) or not (
        source in BUILTIN_SOURCES or source.lower().endswith(PROMPT_SUFFIXES)
    ):
        raise InputError(
            f"detector {name!r}: source={source!r} is not a data set it can be scored on",
            hint=f"use {' or '.join(BUILTIN_SOURCES)}, or the path of a prompt set ({', '.join(PROMPT_SUFFIXES)})",
        )
    return source


class _Declared(Detector):
    """A detector whose facts are given to its constructor (an instance in the registry, not a class).

    Calling the declaration gives a fresh detector to run, as calling a ``Detector`` class does, so
    the registry treats both alike."""

    def __init__(self, name: str, *, role: RoleSpec | None, summary: str, source: str) -> None:
        self.name = check_name(name)
        if role is not None and not isinstance(role, RoleSpec):
            raise InputError(
                f"detector {name!r}: role= takes a headscope.RoleSpec, got {type(role).__name__}"
            )
        if not isinstance(summary, str):
            raise InputError(f"detector {name!r}: summary= takes a text, got {type(summary).__name__}")
        if not summary.strip():
            raise InputError(f"detector {name!r}: summary= is empty", hint="say in one line what it measures")
        self.role = role
        self.roles = {}
        self.summary = summary
        self.default_source = check_source(source, name)

    def __call__(self) -> _Declared:
        return copy.copy(self)

    def role_spec(self, relation: str) -> RoleSpec | None:  # type: ignore[override]
        return self.role

    def role_specs(self) -> list[RoleSpec]:  # type: ignore[override]
        return [self.role] if self.role is not None else []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, source={self.default_source!r})"


class TargetDetector(_Declared):
    """Attention mass on target keys, against the uniform share of those keys: one declaration.

    ``targets(batch)`` returns ``(rows, queries, keys)``, 1-D long tensors: for query ``q`` of row
    ``r``, key ``k`` is a target. Per query with at least one target, the score adds the head's
    attention summed over that query's targets; the score is the mean over those queries. The
    reference is the same sum under uniform attention over the keys the layer's mask leaves visible
    (a sliding window can hide a target). Queries without targets are not counted.

    ``batch`` is a :class:`headscope.capture.Batch`: ``input_ids`` ``[B, T]``, ``attention_mask``
    (real tokens), ``special`` (BOS/CLS/SEP), ``content`` (real, non-special), and
    ``earlier_same_token_pairs``. Targets are checked: inside the batch, on real tokens, no key
    after its query in a causal model; repeated entries count once.
    """

    def __init__(
        self,
        name: str,
        *,
        targets: TargetFn,
        role: RoleSpec | None = None,
        summary: str | None = None,
        source: str | Path = "text",
    ) -> None:
        if not callable(targets):
            raise InputError(f"detector {name!r}: targets= must be a function of a batch")
        super().__init__(
            name,
            role=role,
            summary=summary if summary is not None else f"attention mass on the targets of {name}",
            source=str(source) if isinstance(source, Path) else source,
        )
        self.targets = targets

    def reads(self, batch: Batch) -> Pairs:
        """Its targets: the weight of each query on each of its target keys is all it reads."""
        return Pairs.of(*self.targets_of(batch))

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        pool(self, layer, attn, batch, q_start, self.targets_of(batch))

    def update_pairs(self, layer: int, found: PairWeights, batch: Batch) -> None:
        pool_pairs(self, layer, found, batch, self.targets_of(batch))

    def targets_of(self, batch: Batch) -> Targets:
        """This detector's targets in ``batch``, checked once per batch and kept with it."""
        key = f"targets:{self.name}"
        if key not in batch._cache:
            try:
                found = self.targets(batch)
            except Exception as exc:  # noqa: BLE001 - the declaration's own code: say whose it is
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise RunFailure(
                    f"{with_origin(self.name)}: its targets(batch) raised {type(exc).__name__}: {first}",
                    hint="a bug in the detector's targets function; leave it out with --detectors "
                    "(detectors= in Python) until it is fixed",
                ) from exc
            batch._cache[key] = checked_targets(self.name, found, batch)  # type: ignore[assignment]
        return batch._cache[key]  # type: ignore[return-value]


def with_origin(name: str) -> str:
    """``detector 'name'``, with where it comes from when it is not a built-in (its plugin package,
    or the run-time registration), for messages about its declaration's own code."""
    origin = origin_in("headscope.detectors", name)
    return f"detector {name!r}" if origin in (None, "built-in") else f"detector {name!r} ({origin})"


def checked_targets(name: str, found: Any, batch: Batch) -> Targets:
    """Targets as the pooling reads them: validated, repeated entries dropped, and each query's
    entries next to each other (sorted by row and query only when they are not already)."""
    who = with_origin(name)
    if not (isinstance(found, tuple | list) and len(found) == 3):
        raise HeadscopeError(
            f"{who}: targets(batch) must return (rows, queries, keys), got {type(found).__name__}"
        )
    device = batch.input_ids.device
    parts = []
    for label, part in zip(("rows", "queries", "keys"), found, strict=True):
        try:
            part = torch.as_tensor(part, device=device)
        except (TypeError, ValueError, RuntimeError):
            raise HeadscopeError(
                f"{who}: targets(batch) {label} must be a 1-D tensor of integers, got {type(part).__name__}"
            ) from None
        # Positions are whole numbers: a floating (any precision) or complex tensor would be cut to
        # integers silently (2.5 -> 2), and booleans read as 0 and 1.
        if part.dim() != 1 or (
            part.numel() and (part.is_floating_point() or part.is_complex() or part.dtype == torch.bool)
        ):
            raise HeadscopeError(
                f"{who}: targets(batch) {label} must be a 1-D tensor of integers, got "
                f"{part.dim()}-D {str(part.dtype).removeprefix('torch.')}"
            )
        parts.append(part.long())
    rows, queries, keys = parts
    if not len(rows) == len(queries) == len(keys):
        raise HeadscopeError(
            f"{who}: targets(batch) gave {len(rows)} rows, {len(queries)} queries, {len(keys)} keys"
        )
    if len(rows) == 0:
        return rows, queries, keys
    n_rows, length = batch.input_ids.shape
    if rows.min() < 0 or rows.max() >= n_rows:
        raise HeadscopeError(f"{who}: a target row is outside the batch of {n_rows} rows")
    for label, part in (("query", queries), ("key", keys)):
        if part.min() < 0 or part.max() >= length:
            raise HeadscopeError(f"{who}: a target {label} is outside the batch's {length} positions")
    real = batch.attention_mask
    if not bool((real[rows, queries] & real[rows, keys]).all()):
        raise HeadscopeError(f"{who}: a target query or key is a padding position")
    if batch.is_causal and bool((keys > queries).any()):
        bad = int((keys > queries).nonzero()[0, 0])
        raise HeadscopeError(
            f"{who}: target key {int(keys[bad])} comes after its query {int(queries[bad])}; "
            "a causal model's query never sees a later key"
        )
    entry = (rows * length + queries) * length + keys
    unique = torch.unique(entry)
    if len(unique) < len(entry):  # the same target twice would count its attention twice
        rows, queries, keys = unique // (length * length), (unique // length) % length, unique % length
        return rows, queries, keys
    query_key = rows * length + queries
    runs = 1 + int((query_key[1:] != query_key[:-1]).sum())
    if runs != len(torch.unique(query_key)):
        order = torch.sort(query_key, stable=True).indices
        rows, queries, keys = rows[order], queries[order], keys[order]
    return rows, queries, keys


def pool(
    detector: Detector, layer: int, attn: torch.Tensor, batch: Batch, q_start: int, targets: Targets
) -> None:
    """Add, per row and head, the attention mass on the (sparse) target keys of every query.

    Targets are few per query and kept as coordinates, so the mass is gathered at them instead
    of multiplying the whole [B, H, T, T] map by a dense mask, and no T x T structure is built.
    Each query's entries lie next to each other (:func:`checked_targets`).
    """
    stop = q_start + attn.shape[2]
    key = f"sparse:{id(targets)}:{q_start}:{stop}"
    if key not in batch._cache:
        all_rows, all_queries, all_keys = targets
        inside = (all_queries >= q_start) & (all_queries < stop)
        rows, queries, keys = all_rows[inside], all_queries[inside] - q_start, all_keys[inside]
        # Queries with at least one target, per row: the positions this detector counts.
        first_of_query = torch.ones_like(rows, dtype=torch.bool)
        if len(rows) > 1:
            first_of_query[1:] = (rows[1:] != rows[:-1]) | (queries[1:] != queries[:-1])
        counts = torch.zeros(attn.shape[0], dtype=torch.long, device=attn.device)
        counts.index_add_(0, rows, first_of_query.long())
        batch._cache[key] = (rows, queries, keys, counts)  # type: ignore[assignment]
    rows, queries, keys, counts = batch._cache[key]  # type: ignore[misc]
    mass = attn[rows, :, queries, keys]  # [nnz, H]
    per_head = torch.zeros(attn.shape[0], attn.shape[1], dtype=attn.dtype, device=attn.device)
    per_head.index_add_(0, rows, mass)
    # Uniform attention puts 1/n on each target the layer's mask leaves visible (a sliding window
    # can hide an earlier occurrence), n = the visible keys of that query. Per layer: masks differ.
    n_keys = attn.shape[3]
    visible = batch.visible(q_start, stop, n_keys)
    share = (
        visible[rows, queries, keys].to(attn.dtype)
        / batch.visible_count(q_start, stop, n_keys)[rows, queries]
    )
    baseline = torch.zeros(attn.shape[0], dtype=attn.dtype, device=attn.device).index_add_(0, rows, share)
    detector._accumulate(layer, batch, per_head, counts, baseline)


def pool_pairs(detector: Detector, layer: int, found: PairWeights, batch: Batch, targets: Targets) -> None:
    """:func:`pool` from the weights at the targets themselves (one call per layer): the same sums."""
    rows, queries, _ = targets
    key = f"pairs:{id(targets)}"
    if key not in batch._cache:
        first_of_query = torch.ones_like(rows, dtype=torch.bool)
        if len(rows) > 1:
            first_of_query[1:] = (rows[1:] != rows[:-1]) | (queries[1:] != queries[:-1])
        counts = torch.zeros(batch.input_ids.shape[0], dtype=torch.long, device=rows.device)
        counts.index_add_(0, rows, first_of_query.long())
        batch._cache[key] = counts
    counts = batch._cache[key]
    weights = found.weights
    per_head = torch.zeros(
        batch.input_ids.shape[0], weights.shape[1], dtype=weights.dtype, device=weights.device
    )
    per_head.index_add_(0, rows, weights)
    share = found.visible.to(weights.dtype) / found.keys_seen.to(weights.dtype)
    baseline = torch.zeros(batch.input_ids.shape[0], dtype=weights.dtype, device=weights.device)
    baseline.index_add_(0, rows, share)
    detector._accumulate(layer, batch, per_head, counts, baseline)


# --- patterns (TransformerLens' detect_head) ------------------------------------------------------

Score = Literal["mul", "abs"]
PatternFn = Callable[[torch.Tensor], torch.Tensor]


class PatternDetector(_Declared):
    """A head's attention against a ``[T, T]`` pattern per prompt (TransformerLens' ``detect_head``).

    Per prompt, over its real tokens (``T`` of them, the tokenizer's special tokens included):

    * ``"mul"``: sum(A * P) / sum(A), the share of the head's attention on the pattern;
    * ``"abs"``: 1 - sum(|A - P|) / T, one minus the mean absolute error per row (TransformerLens
      rounds this to 3 decimals; headscope does not).

    ``exclude_bos`` zeroes the first key's column and ``exclude_current_token`` the diagonal, in A
    (mul) or in |A - P| (abs), as TransformerLens does. The score is the mean over prompts, as
    TransformerLens averages over a list of prompts; the reference is the same score of uniform
    attention over each query's visible keys.
    """

    part = "pattern"  # hs.detect's, on its own prompts: never a scan's detector

    def __init__(
        self,
        name: str,
        *,
        patterns: Sequence[torch.Tensor],
        score: Score = "mul",
        exclude_bos: bool = False,
        exclude_current_token: bool = False,
        role: RoleSpec | None = None,
        summary: str | None = None,
        source: str = "text",
    ) -> None:
        if score not in ("mul", "abs"):
            raise InputError(f"score={score!r}: choose mul or abs")
        super().__init__(
            name,
            role=role,
            summary=summary
            if summary is not None
            else f"attention against the pattern '{name}' ({score}, as TransformerLens' detect_head)",
            source=source,
        )
        if not isinstance(patterns, list | tuple) or not all(isinstance(p, torch.Tensor) for p in patterns):
            raise InputError(
                f"detector {name!r}: patterns= takes a list of [T, T] tensors, one per prompt",
                hint="hs.detect builds them (and checks them against the prompts) for you",
            )
        self.patterns = [p.to(torch.float32) for p in patterns]
        self.score = score
        self.exclude_bos = exclude_bos
        self.exclude_current_token = exclude_current_token
        self.baseline_kind = "uniform"

    def start(self, layout: Any, n_examples: int) -> None:
        super().start(layout, n_examples)
        self._partial: dict[int, list[torch.Tensor]] = {}

    def _batch_patterns(self, batch: Batch) -> torch.Tensor:
        """[B, T, T] the rows' patterns, zero-padded to the batch length."""
        key = f"pattern:{self.name}:{id(self)}"
        if key not in batch._cache:
            n_rows, length = batch.input_ids.shape
            dense = torch.zeros(n_rows, length, length, dtype=torch.float32, device=batch.input_ids.device)
            for row, example in enumerate(batch.example_index.tolist()):
                pattern = self.patterns[example]
                n = pattern.shape[0]
                dense[row, :n, :n] = pattern.to(dense.device)
            batch._cache[key] = dense
        return batch._cache[key]

    def _terms(self, attn: torch.Tensor, pattern: torch.Tensor, real_rows: torch.Tensor, q_start: int):
        """Per row and head: (numerator, denominator) of the chunk, for attention ``attn`` [B, H, c, K]."""
        attn = attn * real_rows[:, None, :, None]
        keep = torch.ones_like(attn[:1, :1])
        if self.exclude_bos:
            keep = keep.clone()
            keep[..., 0] = 0
        if self.exclude_current_token:
            keep = keep.clone()
            local = torch.arange(attn.shape[2], device=attn.device)
            diagonal = local + q_start
            inside = diagonal < attn.shape[3]
            keep[..., local[inside], diagonal[inside]] = 0
        if self.score == "mul":
            kept = attn * keep
            return (kept * pattern[:, None]).sum((-1, -2)), kept.sum((-1, -2))
        diff = (attn - pattern[:, None] * real_rows[:, None, :, None]).abs() * keep
        return diff.sum((-1, -2)), None

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        stop = q_start + attn.shape[2]
        keys = attn.shape[3]
        pattern = self._batch_patterns(batch)[:, q_start:stop, :keys]
        real_rows = batch.attention_mask[:, q_start:stop].to(attn.dtype)
        visible = batch.visible(q_start, stop, keys).to(attn.dtype)
        uniform = (visible / visible.sum(-1, keepdim=True).clamp(min=1.0))[:, None]
        head = self._terms(attn, pattern, real_rows, q_start)
        reference = self._terms(uniform, pattern, real_rows, q_start)
        found = [head[0], reference[0][:, 0]]
        if self.score == "mul":
            found += [head[1], reference[1][:, 0]]
        found = [t.double() for t in found]
        if layer not in self._partial:
            self._partial[layer] = found
        else:
            self._partial[layer] = [a + b for a, b in zip(self._partial[layer], found, strict=True)]

    def end_layer(self, layer: int, batch: Batch) -> None:
        parts = self._partial.pop(layer, None)
        if parts is None:
            return
        n = batch.attention_mask.sum(1).double()  # T per row
        if self.score == "mul":
            head_num, ref_num, head_den, ref_den = parts
            per_head = head_num / head_den.clamp(min=1e-12)
            baseline = ref_num / ref_den.clamp(min=1e-12)
        else:
            head_err, ref_err = parts
            per_head = 1.0 - head_err / n[:, None]
            baseline = 1.0 - ref_err / n
        self._accumulate(layer, batch, per_head, torch.ones_like(n), baseline)


def check_patterns(
    name: str, patterns: Sequence[torch.Tensor], lengths: Sequence[int], causal: bool
) -> list[torch.Tensor]:
    """Each prompt's pattern: a finite [T, T] tensor for its T tokens, lower triangular in a causal model."""
    if len(patterns) != len(lengths):
        raise InputError(
            f"{name}: {len(patterns)} patterns for {len(lengths)} prompts", hint="give one per prompt"
        )
    out = []
    for index, (pattern, length) in enumerate(zip(patterns, lengths, strict=True)):
        pattern = torch.as_tensor(pattern).detach()
        if pattern.is_complex():  # a cast to float would drop the imaginary part without a word
            raise InputError(
                f"{name}: the pattern of prompt {index} is complex; a pattern holds real weights"
            )
        pattern = pattern.to("cpu", torch.float32)
        if pattern.shape != (length, length):
            raise InputError(
                f"{name}: the pattern of prompt {index} has shape {tuple(pattern.shape)}, but the prompt "
                f"is {length} tokens (special tokens included)",
                hint="build it from the token ids: pass a function of the ids as pattern=",
            )
        if not bool(torch.isfinite(pattern).all()):
            raise InputError(f"{name}: the pattern of prompt {index} holds NaN or infinity")
        if causal and bool(torch.triu(pattern, diagonal=1).ne(0).any()):
            raise InputError(
                f"{name}: the pattern of prompt {index} has weight above the diagonal; a causal model's "
                "query never sees a later key",
                hint="use torch.tril(pattern)",
            )
        out.append(pattern)
    return out

"""``hs.detect``: your own attention pattern, TransformerLens style, with headscope's verdicts.

``hs.detect(model, tokenizer, prompts, pattern)`` scores every head's attention on your prompts
against a ``[T, T]`` pattern per prompt, as TransformerLens' ``detect_head`` does ("mul": the share
of the head's attention on the pattern; "abs": one minus the mean absolute error per row), and adds
what ``detect_head`` does not give: the same score of uniform attention as the reference, a 95%
bootstrap interval over prompts, a role under the Benjamini–Hochberg rule, and ``verify`` (the top
heads ablated against random same-layer heads, by the prompts' next-token loss).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope import detectors
from headscope.core.rolespec import RoleSpec
from headscope.data.prompts import PromptSet, TextItem, display_path, load_texts
from headscope.detectors.patterns import NAMED
from headscope.detectors.target import PatternDetector, check_name, check_patterns
from headscope.errors import InputError
from headscope.extend.base import encode_texts, model_batches, prompt_set_report, score_batches
from headscope.extend.checks import TableChecked
from headscope.extend.protocol import HELP_BATCH, Outcome, Stats, check_common, option, register
from headscope.verdicts.roles import RoleRule


@dataclass(kw_only=True)
class DetectOptions(Stats):
    prompts: str | Path | list[str] | None = option(
        None, "The prompts: a list of texts, or a prompt set (.yaml, .jsonl or .txt, one text per line)."
    )
    pattern: Any = option(
        None,
        "What a head should attend to: 'previous_token_head', 'duplicate_token_head' or 'induction_head' "
        "(TransformerLens' named patterns), a function of one prompt's token ids [T] -> [T, T], one [T, T] "
        "tensor for every prompt, or a list of them, one per prompt. T counts the special tokens the "
        "tokenizer adds.",
    )
    score: str = option(
        "mul",
        "mul: the share of the head's attention on the pattern; abs: 1 - the mean absolute error per row.",
        choices=("mul", "abs"),
    )
    exclude_bos: bool = option(False, "Leave the first key (BOS) out, as TransformerLens' exclude_bos.")
    exclude_current_token: bool = option(
        False, "Leave each query's own key out, as TransformerLens' exclude_current_token."
    )
    name: str = option("pattern", "The detector's name in the tables, the CSV and the JSON.")
    label: str | None = option(None, "The role's label in the role map (default: the name).")
    verify: bool = option(
        False, "Ablate the top heads and random same-layer heads; report the prompts' next-token loss."
    )
    verify_k: int = option(3, "Heads ablated by verify.", min=1)
    batch_size: int = option(8, HELP_BATCH, min=1)
    role_threshold: float = option(0.3, "Minimum score for a role.")
    role_margin: float = option(0.05, "ci_low must clear the baseline by this much.")
    alpha: float = option(0.05, "False discovery rate for roles (Benjamini–Hochberg).", min=0.0, max=1.0)


@dataclass(frozen=True)
class DetectInputs:
    """What ``check`` read and checked before the model loads."""

    prompts: PromptSet
    pattern: Callable[[torch.Tensor], torch.Tensor] | Sequence[torch.Tensor]
    rule: RoleRule


PROMPT_SUFFIXES = (".yaml", ".yml", ".jsonl", ".txt")
# One string that reads as a file name ("prompts.csv", "data/texts.tsv"): no space, a suffix.
_FILE_NAME = re.compile(r"^\S+\.[A-Za-z][A-Za-z0-9]{0,5}$")


def _names_a_file(text: str) -> bool:
    """A ``prompts=`` string meant as a path: it names something on disk, or reads as a file name."""
    try:
        exists = os.path.exists(text)
    except (OSError, ValueError):  # a name the file system cannot take (NUL, too long): a text
        exists = False
    return exists or bool(_FILE_NAME.match(text))


def _prompt_file(prompts: str | os.PathLike) -> PromptSet:
    path = Path(prompts)
    shown = f"prompts={os.fspath(prompts)!r}"
    suffix = path.suffix.lower()
    formats = "a prompt set is .yaml, .yml, .jsonl or .txt (one text per line)"
    if path.is_dir():
        raise InputError(f"detect: {shown} is a folder; {formats}", hint="pass the prompt-set file")
    if suffix not in (*PROMPT_SUFFIXES, ""):  # no suffix: one text per line, as .txt
        raise InputError(
            f"detect: {shown} is a {suffix} file; {formats}",
            hint="convert it, or pass the texts themselves as a list: prompts=['first text', ...]",
        )
    if not path.is_file():
        raise InputError(f"detect: {shown}: no such file", hint="check the path; " + formats)
    return load_texts(path)


def _prompt_set(prompts: Any) -> PromptSet:
    if prompts is None:
        raise InputError("detect: prompts= is required", hint="a list of texts, or a prompt set file")
    if isinstance(prompts, os.PathLike) or (isinstance(prompts, str) and _names_a_file(prompts)):
        return _prompt_file(prompts)
    if isinstance(prompts, str):
        prompts = [prompts]
    items = []
    for index, text in enumerate(prompts):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"detect: prompts[{index}] is not a non-empty text")
        items.append(TextItem(f"prompt-{index}", text, None, f"prompts[{index}]"))
    if not items:
        raise InputError("detect: prompts= is empty")
    return PromptSet("prompts", items, "prompts=")


def _pattern(pattern: Any, n_prompts: int) -> Callable[[torch.Tensor], torch.Tensor] | list[torch.Tensor]:
    if pattern is None:
        raise InputError(
            "detect: pattern= is required", hint=f"e.g. {', '.join(NAMED)}, or a function of the ids"
        )
    if isinstance(pattern, str):
        if pattern not in NAMED:
            raise InputError(
                f"detect: pattern={pattern!r} is not a named pattern", hint=f"choose from {', '.join(NAMED)}"
            )
        return NAMED[pattern]
    if isinstance(pattern, np.ndarray):  # numpy as torch: one [T, T] array, or one per prompt
        pattern = torch.as_tensor(pattern)
    elif isinstance(pattern, list | tuple) and any(isinstance(p, np.ndarray) for p in pattern):
        pattern = [torch.as_tensor(p) if isinstance(p, np.ndarray) else p for p in pattern]
    if isinstance(pattern, torch.Tensor):
        if pattern.dim() != 2:
            raise InputError(f"detect: pattern= has shape {tuple(pattern.shape)}; a pattern is [T, T]")
        return [pattern] * n_prompts
    if isinstance(pattern, list | tuple) and pattern and all(isinstance(p, torch.Tensor) for p in pattern):
        if len(pattern) != n_prompts:
            raise InputError(
                f"detect: {len(pattern)} patterns for {n_prompts} prompts", hint="give one per prompt"
            )
        return list(pattern)
    if isinstance(pattern, list | tuple):
        if not pattern:
            raise InputError("detect: pattern= is an empty list", hint="give one [T, T] tensor per prompt")
        index, bad = next((i, p) for i, p in enumerate(pattern) if not isinstance(p, torch.Tensor))
        raise InputError(
            f"detect: pattern[{index}] is {type(bad).__name__}, not a [T, T] tensor",
            hint="give one [T, T] tensor per prompt, or a function of the token ids",
        )
    if callable(pattern):
        return pattern
    raise InputError(
        f"detect: pattern= takes a name, a function of the token ids, or [T, T] tensors; got {type(pattern).__name__}"
    )


@register
class Detect(TableChecked):
    name = "detect"
    summary = "Your own attention pattern, TransformerLens style: every head scored, with a baseline, an interval and a role."
    options = DetectOptions
    json_roles = True
    cli = False  # the pattern is a tensor or a function: a Python-only analysis
    positional = ("prompts", "pattern")  # hs.detect(model, tokenizer, prompts, pattern, ...)
    verify_min_n = 1  # n counts prompts here (one score per prompt): any number of prompts is checked

    def check(self, options: DetectOptions) -> DetectInputs:
        check_common(options)
        check_name(options.name)
        if options.label is not None:
            check_name(options.label, "label")
        if options.name in detectors.REGISTRY:
            raise InputError(
                f"detect: name={options.name!r} is the {detectors.REGISTRY.origin(options.name)} detector",
                hint="choose another name= for your pattern",
            )
        reserved = detectors.reserved_detector_name(options.name)
        if reserved is not None and options.name not in detectors.PATTERNS:  # a pattern replaces its own
            raise InputError(f"detect: name={options.name!r}: {reserved}", hint="choose another name=")
        # A role label names one role in the role map and the legends, whoever declared it.
        label = options.label or options.name
        owner = detectors.label_owner(label, pattern=options.name)
        if owner is not None:
            if options.label is not None:
                raise InputError(
                    f"detect: label={label!r} is the role label of {owner}",
                    hint="choose another label= for your pattern's role",
                )
            raise InputError(
                f"detect: name={label!r} is also the role's label (no label= given), and {owner} has that label",
                hint="pass another label=, or choose another name=",
            )
        prompt_set = _prompt_set(options.prompts)
        return DetectInputs(
            prompt_set,
            _pattern(options.pattern, len(prompt_set.items)),
            RoleRule(threshold=options.role_threshold, margin=options.role_margin, alpha=options.alpha),
        )

    def run(self, loaded: Any, options: DetectOptions, prepared: DetectInputs, progress: Any) -> Outcome:
        prompt_set = prepared.prompts
        sequences, specials = encode_texts(loaded, prompt_set)
        if callable(prepared.pattern):
            made = []
            for index, ids in enumerate(sequences):
                where = f"pattern {options.name!r}: pattern({prompt_set.items[index].source}'s token ids)"
                try:
                    found = prepared.pattern(torch.tensor(ids, dtype=torch.long))
                except Exception as exc:  # noqa: BLE001 - the user's function: say which prompt
                    raise InputError(f"detect: {where} raised {type(exc).__name__}: {exc}") from exc
                if not isinstance(found, torch.Tensor | np.ndarray):
                    raise InputError(
                        f"detect: {where} returned {type(found).__name__}, not a [T, T] tensor",
                        hint=f"the function gets the {len(ids)} token ids of one prompt and returns a "
                        f"[{len(ids)}, {len(ids)}] tensor",
                    )
                made.append(found)
        else:
            made = list(prepared.pattern)
        patterns = check_patterns(options.name, made, [len(s) for s in sequences], loaded.is_causal)
        notes = []
        values = torch.cat([p.flatten() for p in patterns]).unique()
        if options.score == "mul" and not bool(((values == 0) | (values == 1)).all()):
            notes.append(
                f"{options.name}: the pattern holds values other than 0 and 1; 'mul' then weights the "
                "attention by them (TransformerLens warns the same)"
            )
        if all(float(p.sum()) == 0 for p in patterns):
            raise InputError(f"detect: the pattern {options.name!r} is all zeros on every prompt")
        label = options.label or options.name
        role = RoleSpec(
            label,
            f"{options.name} ({options.score} against your pattern)",
            data=prompt_set.name,
            verify="text",
        )
        detector = PatternDetector(
            options.name,
            patterns=patterns,
            score=options.score,  # type: ignore[arg-type]
            exclude_bos=options.exclude_bos,
            exclude_current_token=options.exclude_current_token,
            role=role,
        )
        # Kept in the detector table by name (replacing an earlier hs.detect of the same name) so the
        # role map, the legends and the report find its role as they find a registered detector's.
        detectors.keep_pattern(detector)
        batches = model_batches(loaded, sequences, specials, options.batch_size)
        results = score_batches(
            loaded, batches, [detector], len(sequences), prompt_set.name, progress=progress
        )
        description = f"{display_path(prompt_set.path)} ({len(sequences)} prompts)"
        report = prompt_set_report(
            loaded,
            results,
            prompt_set.name,
            description,
            notes,
            batches,
            options.resamples,
            options.seed,
            role_rule=prepared.rule,
        )
        return Outcome(report, state={"rule": prepared.rule})

    def json(self, outcome: Outcome) -> dict[str, Any]:
        tables = [c.to_json() for c in outcome.checks if c.kind == "table"]
        return {"role_rule": outcome.state["rule"].describe(), "verification": tables or None}

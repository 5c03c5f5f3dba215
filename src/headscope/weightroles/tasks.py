"""Ordinal tasks resolved against a tokenizer: which members are one token, and in which form.

A successor head's OV circuit maps a member's token to the next member's token, so only members
that are exactly one token take part. A member can be one token in one form and not the other:

* ``spaced``: ``" " + member``, as in running text ("on Monday"); the usual form for byte-level BPE
  tokenizers (GPT-2, Llama 3, SmolLM2), where "Monday" and " Monday" are different tokens;
* ``bare``: the member alone, as written in scripts without spaces (一二三) or after a digit.

Each task takes the form in which the most members are one token (a tie goes to ``spaced``, or to
``bare`` for Chinese sets). A member qualifies when ``tokenizer(text, add_special_tokens=False)``
gives exactly one id that is not a special token (so WordPiece's ``[UNK]`` never counts); when two
members give the same id (an uncased tokenizer, say), the first keeps it. SentencePiece tokenizers
that add a dummy prefix may encode " Monday" as two tokens ("▁" then "▁Monday"); the bare form
then wins on its own count.

No torch here: the head scores live with the OV circuits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from headscope.data.ordinal import OrdinalSet, OrdinalTask
from headscope.data.prompts import display_path
from headscope.errors import InputError, elide

Form = Literal["spaced", "bare"]
FORMS: tuple[Form, ...] = ("spaced", "bare")


@dataclass(frozen=True)
class ResolvedTask:
    name: str
    form: Form  # "spaced" (" " + member) or "bare" (member)
    members: tuple[str, ...]  # all members, in the file's order
    token_ids: tuple[int | None, ...]  # one per member; None where it is not one token in this form

    @property
    def qualified(self) -> list[int]:
        """Indices of the members that are one token."""
        return [i for i, token in enumerate(self.token_ids) if token is not None]

    @property
    def size(self) -> int:
        """How many members are one token."""
        return len(self.qualified)

    def text(self, index: int) -> str:
        """Member ``index`` as tokenized in this task's form."""
        return " " + self.members[index] if self.form == "spaced" else self.members[index]

    def pairs(self) -> list[tuple[int, int]]:
        """(token of member i, token of member i + 1) for consecutive members that are both one token."""
        ids = self.token_ids
        return [(a, b) for a, b in zip(ids[:-1], ids[1:], strict=True) if a is not None and b is not None]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:
        ids.add(unk)
    return ids


def _single_token(tokenizer: Any, text: str, special: set[int]) -> int | None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1 or int(ids[0]) in special:
        return None
    return int(ids[0])


def _resolve_form(task: OrdinalTask, form: Form, tokenizer: Any, special: set[int]) -> tuple[int | None, ...]:
    seen: set[int] = set()
    token_ids: list[int | None] = []
    for member in task.members:
        token = _single_token(tokenizer, " " + member if form == "spaced" else member, special)
        if token is not None and token in seen:
            token = None
        if token is not None:
            seen.add(token)
        token_ids.append(token)
    return tuple(token_ids)


def resolve_task(task: OrdinalTask, tokenizer: Any, lang: str = "en") -> ResolvedTask:
    """One task in the form where the most members are one token (tie: bare for zh, else spaced)."""
    special = _special_ids(tokenizer)
    by_form = {form: _resolve_form(task, form, tokenizer, special) for form in FORMS}
    preferred: Form = "bare" if lang == "zh" else "spaced"
    other: Form = "spaced" if preferred == "bare" else "bare"

    def count(form: Form) -> int:
        return sum(token is not None for token in by_form[form])

    form = other if count(other) > count(preferred) else preferred
    return ResolvedTask(task.name, form, task.members, by_form[form])


def check_distinct_sets(task_sets: Sequence[OrdinalSet]) -> None:
    """Refuse two task sets with the same name: results are labelled by set name, so one set's
    scores would be shown under the other's label (and one of them dropped)."""
    first: dict[str, OrdinalSet] = {}
    for task_set in task_sets:
        earlier = first.get(task_set.name)
        if earlier is None:
            first[task_set.name] = task_set
            continue
        here, there = display_path(task_set.path), display_path(earlier.path)
        if Path(task_set.path).resolve() == Path(earlier.path).resolve():
            raise InputError(f"--tasks {elide(here, 200)} is given twice", hint="give each file once")
        raise InputError(
            f"--tasks {elide(there, 200)} and {elide(here, 200)} both name their task set '{elide(task_set.name)}'",
            hint="give each file its own 'name:'; results are labelled by it",
        )


def resolve_tasks(tasks: OrdinalSet, tokenizer: Any) -> list[ResolvedTask]:
    """Every task of the set, resolved against ``tokenizer`` (a Hugging Face tokenizer or alike)."""
    return [resolve_task(task, tokenizer, tasks.lang) for task in tasks.tasks]


def continuation_prompts(task: ResolvedTask, window: int = 3) -> list[tuple[list[int], int]]:
    """(context, target) pairs: members ``i..i+window-1`` as token ids, then member ``i+window``'s token.

    Only runs of ``window + 1`` consecutive members that are all one token count. No BOS is added:
    the caller prepends the model's own.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    ids: Sequence[int | None] = task.token_ids
    prompts = []
    for start in range(len(ids) - window):
        run = ids[start : start + window + 1]
        if all(token is not None for token in run):
            tokens = [int(token) for token in run if token is not None]
            prompts.append((tokens[:-1], tokens[-1]))
    return prompts

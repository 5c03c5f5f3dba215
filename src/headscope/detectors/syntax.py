"""Syntactic heads (Clark et al. 2019): does the most-attended word match the gold dependency?

For every arc (dependent d, head h, relation r) and each direction:

* ``dep->head``: the dependent's word-level attention row; correct when its argmax (self
  excluded) is h;
* ``head->dep``: the head's row; correct when its argmax is d.

In a causal model a word sees only earlier words, so a direction whose target comes later is not
counted (n says how many pairs each direction could see). The baseline is the best trivial
positional rule, chosen per relation and direction on the same pairs: "always the word k positions
away" for k in [-max_offset, max_offset] without 0, or "always the first word". The first-word rule
matters for causal models, whose sink heads park attention on the first token: when a sentence
starts with its subordinator (如果…, Because…), a sink head "finds" the mark for free.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headscope.capture import Batch
from headscope.core.rolespec import PLAIN_COLOR
from headscope.detectors.base import DetectorResult, RoleSpec
from headscope.detectors.words import WordLevelDetector, word_maps
from headscope.models import HeadLayout

DIRECTIONS = ("dep->head", "head->dep")
DEFAULT_RELATIONS = ("nsubj", "obj", "det", "amod", "advmod", "aux", "case", "mark")

# Plain-language names shown next to UD labels.
RELATION_NAMES = {
    "nsubj": "subject–verb (主谓)",
    "obj": "verb–object (动宾)",
    "iobj": "verb–indirect object",
    "det": "determiner–noun",
    "amod": "adjective–noun",
    "advmod": "adverb–modified word",
    "aux": "auxiliary–verb",
    "case": "case marker/preposition–noun",
    "mark": "subordinator–clause",
    "clf": "classifier–noun (量词)",
    "nmod": "noun–noun modifier",
    "obl": "oblique–verb",
    "compound": "compound",
    "conj": "conjunct",
    "cc": "coordinator",
    "advcl": "adverbial clause",
    "acl": "clausal modifier",
    "xcomp": "open clausal complement",
    "ccomp": "clausal complement",
    "cop": "copula",
    "nummod": "number–noun",
    "coref": "pronoun → antecedent (指代)",
}


def relation_role(
    relation: str, label: str | None = None, meaning: str | None = None, color: str = PLAIN_COLOR
) -> RoleSpec:
    """The role of one relation's tables: labelled by the relation's first five letters unless named,
    explained by its plain-language name (where the label is a key of RELATION_NAMES)."""
    label = label or relation[:5]
    return RoleSpec(
        label,
        meaning or RELATION_NAMES.get(label, label),
        color,
        data="dependency-parsed sentences (CoNLL-U)",
        verify="dependents",
    )


# Every named relation has its role, so the legends find its label; the ones below have a label, a
# legend text or an HTML colour of their own. A relation not named here gets relation_role's
# defaults. ("coref" in RELATION_NAMES names the coreference table; that role is the coref detector's.)
RELATION_ROLES = {
    **{relation: relation_role(relation) for relation in RELATION_NAMES if relation != "coref"},
    "nsubj": relation_role("nsubj", "subj", "nsubj, subject–verb (主谓)", "#fab005"),
    "obj": relation_role("obj", meaning="obj, verb–object (动宾)", color="#fd7e14"),
    "det": relation_role("det", color="#74c0fc"),
    "amod": relation_role("amod", color="#a9e34b"),
    "advmod": relation_role("advmod", "adv", "advmod, adverb–modified word", "#ffa8a8"),
    "aux": relation_role("aux", color="#63e6be"),
    "case": relation_role("case", color="#b197fc"),
    "mark": relation_role("mark", color="#ffd43b"),
    "clf": relation_role("clf", color="#e599f7"),
}


class SyntaxDetector(WordLevelDetector):
    name = "syntax"
    summary = "accuracy of the most-attended word (self excluded) against the gold dependency"
    needs = frozenset({"words", "arcs"})
    default_source = "treebank"
    baseline_kind = "positional"
    roles = RELATION_ROLES
    # One summary table per treebank, a row per relation and direction.
    grouped = True
    relation_names = RELATION_NAMES
    heading = "{detector} · {data}"
    caption = (
        "data: {description}; baseline: best positional rule (always the word k positions away, or "
        "always the first word); CI: 95% bootstrap over sentences"
    )
    short_name = "{data} {relation} {direction}"

    @classmethod
    def role_spec(cls, relation: str) -> RoleSpec:
        return cls.roles.get(relation) or relation_role(relation)

    def __init__(self, relations: Sequence[str] = DEFAULT_RELATIONS, max_offset: int = 5) -> None:
        self.relations = list(dict.fromkeys(relations))
        self.max_offset = max_offset
        self.keys = [(r, d) for r in self.relations for d in DIRECTIONS]
        self._key_index = {key: i for i, key in enumerate(self.keys)}

    def start(self, layout: HeadLayout, n_examples: int) -> None:
        self.layout = layout
        self.n_examples = n_examples
        n_keys = len(self.keys)
        self._hits = torch.zeros(n_keys, n_examples, layout.n_layers, layout.n_heads, dtype=torch.float32)
        self._pairs = torch.zeros(n_keys, n_examples, dtype=torch.float64)
        # Columns: offsets -max..+max, then "first word".
        self._offset_hits = torch.zeros(n_keys, n_examples, 2 * self.max_offset + 2, dtype=torch.float64)
        self._counted_layer: int | None = None

    def _pairs_of(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Flattened (row, query word, target word, key) for every arc direction the model can see."""
        if "syntax_pairs" in batch._cache:
            return batch._cache  # type: ignore[return-value]
        rows, queries, targets, keys = [], [], [], []
        for row, meta in enumerate(batch.meta):
            for dep, head, rel in meta["arcs"]:
                for direction in DIRECTIONS:
                    key = self._key_index.get((rel, direction))
                    if key is None:
                        continue
                    query, target = (dep, head) if direction == "dep->head" else (head, dep)
                    if batch.is_causal and target > query:
                        continue  # the query word cannot see a later word
                    rows.append(row)
                    queries.append(query)
                    targets.append(target)
                    keys.append(key)
        device = batch.input_ids.device
        batch._cache["syntax_pairs"] = torch.tensor(rows, dtype=torch.long, device=device)
        batch._cache["syntax_queries"] = torch.tensor(queries, dtype=torch.long, device=device)
        batch._cache["syntax_targets"] = torch.tensor(targets, dtype=torch.long, device=device)
        batch._cache["syntax_keys"] = torch.tensor(keys, dtype=torch.long, device=device)
        return batch._cache  # type: ignore[return-value]

    def score_words(self, layer: int, scores: torch.Tensor, batch: Batch) -> None:
        cache = self._pairs_of(batch)
        rows, queries, targets, keys = (
            cache["syntax_pairs"],
            cache["syntax_queries"],
            cache["syntax_targets"],
            cache["syntax_keys"],
        )
        if len(rows) == 0:
            return
        word_mask = word_maps(batch)[2]
        n_words = scores.shape[-1]
        allowed = word_mask[:, None, None, :] & ~torch.eye(n_words, dtype=torch.bool, device=scores.device)
        if batch.is_causal:
            allowed = allowed & torch.ones(n_words, n_words, dtype=torch.bool, device=scores.device).tril()
        predicted = scores.masked_fill(~allowed, float("-inf")).argmax(-1)  # [B, H, W]
        hits = predicted[rows, :, queries] == targets[:, None]  # [P, H]
        examples = batch.example_index.to(rows.device)[rows]
        layer_index = torch.full_like(rows, layer)
        self._hits.index_put_(
            (keys.cpu(), examples.cpu(), layer_index.cpu()), hits.float().cpu(), accumulate=True
        )
        if self._counted_layer is None:
            self._counted_layer = layer
        if layer == self._counted_layer:  # pair counts and offsets do not depend on the layer
            ones = torch.ones(len(rows), dtype=torch.float64)
            self._pairs.index_put_((keys.cpu(), examples.cpu()), ones, accumulate=True)
            offsets = (targets - queries).cpu()
            inside = offsets.abs() <= self.max_offset
            self._offset_hits.index_put_(
                (keys.cpu()[inside], examples.cpu()[inside], offsets[inside] + self.max_offset),
                ones[inside],
                accumulate=True,
            )
            first = (targets == 0).cpu() & (queries != 0).cpu()
            first_column = torch.full_like(keys.cpu()[first], 2 * self.max_offset + 1)
            self._offset_hits.index_put_(
                (keys.cpu()[first], examples.cpu()[first], first_column), ones[first], accumulate=True
            )

    def best_baseline(self, key: int) -> tuple[str, torch.Tensor]:
        """The best positional rule for one (relation, direction): its label and per-example hits."""
        totals = self._offset_hits[key].sum(0)
        totals[self.max_offset] = -1  # offset 0 is the word itself
        best = int(totals.argmax())
        label = "first word" if best == 2 * self.max_offset + 1 else f"offset {best - self.max_offset:+d}"
        return label, self._offset_hits[key, :, best]

    def results(self, data: str = "") -> list[DetectorResult]:
        out = []
        for key, (relation, direction) in enumerate(self.keys):
            counts = self._pairs[key]
            if counts.sum() == 0:
                continue
            label, baseline = self.best_baseline(key)
            out.append(
                DetectorResult(
                    self.name,
                    relation,
                    direction,
                    self._hits[key].double(),
                    counts,
                    baseline,
                    self.baseline_kind,
                    data,
                    baseline_label=label,
                )
            )
        return out

    def unscored(self) -> list[tuple[str, str]]:
        """(relation, direction) pairs that had no visible arcs."""
        return [key for i, key in enumerate(self.keys) if self._pairs[i].sum() == 0]

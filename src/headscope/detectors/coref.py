"""Coreference heads: does the pronoun attend most to its antecedent among the candidates?

Each example has a pronoun (or demonstrative) span and candidate mention spans. A head is right
on an example when, of the visible candidates, the one that receives the most attention from the
pronoun (mean over the pronoun's tokens, summed over the candidate's tokens) is the antecedent.
Baselines: the nearest visible candidate (the baseline column), chance (1 / visible candidates)
and "always the first candidate", which a sink-like head gets for free when the first candidate
opens the sentence. The role test uses the strongest of the three.
"""

from __future__ import annotations

import torch

from headscope.capture import Batch
from headscope.detectors.base import DetectorResult, RoleSpec
from headscope.detectors.words import WordLevelDetector


class CorefDetector(WordLevelDetector):
    name = "coref"
    summary = "accuracy of the most-attended candidate, from the pronoun, against the gold antecedent"
    needs = frozenset({"coref"})
    default_source = "coref"
    baseline_kind = "nearest-candidate"
    heading = "coreference · {data} · pronoun → antecedent (指代)"
    caption = (
        "data: {description}; n = {n} examples; nearest-candidate baseline = {baseline}; chance = "
        "{extras[chance]}; first-candidate = {extras[first candidate]}; CI: 95% bootstrap over examples"
    )
    short_name = "{data}"
    role = RoleSpec(
        "coref",
        "pronoun → antecedent (指代)",
        "#2f9e44",
        "bold green",
        data="pronouns with candidate antecedents",
        verify="pronouns",
    )

    def start(self, layout, n_examples):  # noqa: ANN001
        super().start(layout, n_examples)
        self._chance = torch.zeros(n_examples, dtype=torch.float64)
        self._first = torch.zeros(n_examples, dtype=torch.float64)

    def score_words(self, layer: int, scores: torch.Tensor, batch: Batch) -> None:
        scores = scores[:, :, 0, 1:]  # row 0 is the pronoun; columns 1.. the candidates: [B, H, C]
        visible = torch.zeros(scores.shape[0], scores.shape[-1], dtype=torch.bool, device=scores.device)
        for row, meta in enumerate(batch.meta):
            visible[row, : len(meta["visible"])] = torch.tensor(meta["visible"])
        predicted = scores.masked_fill(~visible[:, None, :], float("-inf")).argmax(-1)  # [B, H]
        antecedent = torch.tensor([m["antecedent"] for m in batch.meta], device=scores.device)
        hits = (predicted == antecedent[:, None]).float()
        counts = torch.ones(len(batch.meta))
        nearest = torch.tensor([float(m["nearest"] == m["antecedent"]) for m in batch.meta])
        self._accumulate(layer, batch, hits, counts, nearest)
        if layer == self._counted_layer:
            chance = torch.tensor([1.0 / sum(m["visible"]) for m in batch.meta], dtype=torch.float64)
            self._chance[batch.example_index] += chance
            first = torch.tensor(
                [float(m["visible"].index(True) == m["antecedent"]) for m in batch.meta], dtype=torch.float64
            )
            self._first[batch.example_index] += first

    def results(self, data: str = "") -> list[DetectorResult]:
        self._on_host()
        total = self._counts.sum()
        chance = float(self._chance.sum() / total) if total > 0 else float("nan")
        first = float(self._first.sum() / total) if total > 0 else float("nan")
        return [
            DetectorResult(
                self.name,
                "coref",
                "pronoun->antecedent",
                self._sums,
                self._counts,
                self._baseline,
                self.baseline_kind,
                data,
                extras={"chance": chance, "first candidate": first},
            )
        ]

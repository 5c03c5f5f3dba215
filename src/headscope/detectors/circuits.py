"""Where circuit heads look: the IOI heads' attention from the last token, and retrieval heads.

Both read positions that the analysis puts in each row's ``meta``:

* ``ioi``: ``end`` (the last prompt token, where the indirect object is predicted) and
  ``targets``, token positions of ``io``, ``s1`` and ``s2``. Per head: the attention from ``end``
  summed over each target's tokens. The uniform reference is the share of visible keys that the
  target's tokens make up. What the heads *write* there (direct logit attribution) comes from
  :class:`headscope.capture.dla.HeadWrites`; the roles need both.
* ``retrieval``: ``queries`` (positions whose next token is an answer token) and ``needle_keys``
  (for each query, the needle positions that hold that answer token). A head hits a query when
  its argmax key is one of them (Wu et al. 2024). Whether a query counts depends on the model's
  own prediction there, known only after the forward pass, so hits wait in ``pending`` until the
  analysis calls :meth:`RetrievalDetector.settle`.
"""

from __future__ import annotations

import torch

from headscope.capture import Batch, rows
from headscope.detectors.base import Detector, DetectorResult, RoleSpec
from headscope.models import HeadLayout

IOI_TARGETS = ("io", "s1", "s2")


class IOIAttentionDetector(Detector):
    name = "ioi"
    summary = "indirect object identification: attention from the last token to IO, S1 and S2, and DLA toward IO against S"
    default_source = "ioi"
    needs = frozenset({"tokens", "positions"})  # positions the analysis puts in each row's meta
    baseline_kind = "uniform"
    # The attention table describes where the heads look (it feeds the name-mover test); the DLA
    # and path-patching tables (headscope.capture.dla, analyses.ioi) name the roles, and the whole
    # circuit is checked by the logit difference with the name movers ablated.
    roles = {
        "attention": RoleSpec(
            "ioi",
            "attention from the last token to IO, S1 and S2",
            data="IOI prompts",
            kind="descriptive",
        ),
        "dla": RoleSpec(
            "nm",
            "name mover (writes IO)",
            "#1c7ed6",
            "bold blue",
            data="IOI prompts",
            verify="logit-difference",
            kind="signed",
            negative=RoleSpec(
                "neg",
                "negative name mover (writes against IO)",
                "#364fc7",
                "blue",
                data="IOI prompts",
                verify="logit-difference",
                kind="signed",
            ),
        ),
        "s-inhibition": RoleSpec(
            "sinh",
            "S-inhibition (steers name movers off S)",
            "#0ca678",
            "bold cyan",
            data="IOI prompts",
            verify="logit-difference",
            kind="signed",
        ),
    }

    def reads(self, batch: Batch) -> torch.Tensor:
        """The last token of each prompt (``end``): the only row the attention table reads."""
        return rows.at_positions(batch, [[int(meta["end"])] for meta in batch.meta])

    def start(self, layout: HeadLayout, n_examples: int) -> None:
        super().start(layout, n_examples)
        shape = (len(IOI_TARGETS), n_examples, layout.n_layers, layout.n_heads)
        self._target_sums = torch.zeros(shape, dtype=torch.float64)
        self._target_base = torch.zeros(len(IOI_TARGETS), n_examples, layout.n_layers, dtype=torch.float64)

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        stop = q_start + attn.shape[2]
        keys = attn.shape[3]
        picked = [(row, int(meta["end"]) - q_start) for row, meta in enumerate(batch.meta)]
        picked = [(row, at) for row, at in picked if 0 <= at < stop - q_start]
        if not picked:
            return
        visible = batch.visible(q_start, stop, keys)
        counts = batch.visible_count(q_start, stop, keys)
        rows_ = torch.as_tensor([row for row, _ in picked])
        at = torch.as_tensor([a for _, a in picked])
        # [R, targets, K']: 1 at each row's target tokens, so that all rows and targets are one product.
        marks = torch.zeros(len(picked), len(IOI_TARGETS), keys, dtype=attn.dtype)
        for index, (row, _) in enumerate(picked):
            for t, target in enumerate(IOI_TARGETS):
                positions = [p for p in batch.meta[row]["targets"][target] if p < keys]
                marks[index, t, positions] = 1.0
        marks = marks.to(attn.device)
        weights = attn[rows_.to(attn.device), :, at.to(attn.device)]  # [R, H, K']
        sums = torch.einsum("rhk,rtk->trh", weights, marks).double().cpu()
        open_ = (visible[rows_, at][:, None, :].to(marks.device) * marks).to(torch.float64).sum(-1)
        base = (open_.cpu() / counts[rows_, at].double().cpu()[:, None]).T  # [targets, R]
        examples = batch.example_index[rows_].long()
        self._target_sums[:, examples, layer] += sums
        self._target_base[:, examples, layer] += base
        # Counted on the first layer that arrives: a hybrid's layer 0 may have no attention
        # (Jamba, Qwen3-Next), and "layer == 0" then counted nothing (n = 0 tables).
        if self._counted_layer is None:
            self._counted_layer = layer
        if layer == self._counted_layer:
            self._counts[examples] += 1.0

    def results(self, data: str = "") -> list[DetectorResult]:
        return [
            DetectorResult(
                self.name,
                "attention",
                target,
                self._target_sums[index],
                self._counts,
                self._target_base[index],
                self.baseline_kind,
                data,
            )
            for index, target in enumerate(IOI_TARGETS)
        ]


class RetrievalDetector(Detector):
    name = "retrieval"
    summary = "retrieval (Wu et al. 2024): at answer tokens the model gets right, the head's argmax key is the needle token it copies"
    default_source = "retrieval"
    needs = frozenset({"tokens", "positions"})
    heading = "{detector} · {data}"  # one table per haystack
    baseline_kind = "uniform"
    role = RoleSpec(
        "retr",
        "retrieval head (copies the needle)",
        "#f59f00",
        "bold yellow",
        data="needle-in-a-haystack prompts",
        verify="needle-accuracy",
    )

    def reads(self, batch: Batch) -> torch.Tensor:
        """The answer positions: the rows whose argmax key is checked against the needle."""
        return rows.at_positions(batch, [meta["queries"] for meta in batch.meta])

    def start(self, layout: HeadLayout, n_examples: int) -> None:
        super().start(layout, n_examples)
        self.pending: dict[tuple[int, int], torch.Tensor] = {}  # (row, query) -> [L, H] bool
        self.pending_base: dict[tuple[int, int], torch.Tensor] = {}  # (row, query) -> [L]

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        stop = q_start + attn.shape[2]
        keys = attn.shape[3]
        visible = None
        for row, meta in enumerate(batch.meta):
            for query, needle_keys in zip(meta["queries"], meta["needle_keys"], strict=True):
                if not q_start <= query < stop:
                    continue
                if visible is None:
                    visible = batch.visible(q_start, stop, keys)
                local = query - q_start
                top = attn[row, :, local].argmax(-1).cpu()  # [H]
                wanted = torch.as_tensor(needle_keys, dtype=torch.long)
                hits = (top[:, None] == wanted[None, :]).any(-1)
                slot = (row, query)
                if slot not in self.pending:
                    self.pending[slot] = torch.zeros(
                        self.layout.n_layers, self.layout.n_heads, dtype=torch.bool
                    )
                    self.pending_base[slot] = torch.zeros(self.layout.n_layers, dtype=torch.float64)
                self.pending[slot][layer] = hits
                inside = wanted[wanted < keys]
                seen = visible[row, local].cpu()
                self.pending_base[slot][layer] = float(seen[inside].sum()) / max(1.0, float(seen.sum()))

    def settle(self, batch: Batch, correct: dict[tuple[int, int], bool]) -> None:
        """Count the queries where the model's top-1 prediction was the gold answer token."""
        for (row, query), hits in self.pending.items():
            if not correct.get((row, query), False):
                continue
            example = int(batch.example_index[row])
            self._sums[example] += hits.to(torch.float64)
            self._baseline[example] += self.pending_base[(row, query)]
            self._counts[example] += 1.0
        self.pending.clear()
        self.pending_base.clear()

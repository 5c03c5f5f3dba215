"""Each head's OV circuit, read from the weights: what it writes, in logits, for a token it attends to.

For query head ``h`` of layer ``l`` (row vectors)::

    logits(t) = norm_l(e(t)) @ W_V[g(h)] @ W_O[h] @ diag(post_l) @ fold(W_U)^T

* ``e(t)`` is the token's embedding: ``raw`` (the embedding module's output, so Gemma's √d scale is
  in it) or ``mlp0`` (the residual after block 0 when the token is alone in its sequence, so it
  attends only to itself: the "effective embedding" of Gould et al. and TransformerLens). Layer 0's
  heads read the raw embedding in both modes, because that is what they see.
* ``norm_l`` is the layer's input norm, applied as the module itself (Gemma's ``1 + w`` included).
* ``W_V[g(h)]`` belongs to the head's KV group (GQA/MQA: ``g(h) = h // (H / H_kv)``); ``W_O[h]`` is
  the query head's own slice of the output projection.
* ``post_l`` is the gain of a norm on the attention output (Gemma 2/3's ``post_attention_layernorm``).
* ``fold(W_U)`` is the unembedding with the final norm's gain (and LayerNorm's centring) folded in.

Norm statistics are positive per-row scalars, and soft-capping is monotone, so neither changes which
tokens a head's output ranks highest: the token tests need no statistic. Biases (value, output,
final norm, unembedding) add the same logits whatever the head attends to and are left out, as in
TransformerLens' ``OV`` circuits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from headscope.capture.batch import make_batches
from headscope.capture.dla import FrozenNorm, unembedding
from headscope.errors import InputError, RunFailure
from headscope.models import anatomy, projections
from headscope.models.projections import ValuePath

Embedding = Literal["raw", "mlp0"]
EMBEDDINGS: tuple[str, ...] = ("raw", "mlp0")

_UNUSED = re.compile(r"^[<\[](unused|UNUSED)[-_]?\d+[>\]]$")


def check_embedding(name: str) -> Embedding:
    if name not in EMBEDDINGS:
        raise InputError(f"--embedding must be raw or mlp0, got {name!r}")
    return name  # type: ignore[return-value]


def ordinary_ids(loaded: Any) -> torch.Tensor:
    """Token ids a head can be tested on: not special, not unused, present in the embedding."""
    tokenizer = loaded.tokenizer
    n = min(len(tokenizer), loaded.model.get_input_embeddings().num_embeddings)
    allowed = torch.ones(n, dtype=torch.bool)
    special = {i for i in tokenizer.all_special_ids if i is not None}
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {i for i, tok in decoder.items() if getattr(tok, "special", False)}
    for index in special:
        if 0 <= index < n:
            allowed[index] = False
    for index, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(n)))):
        if token is None or _UNUSED.match(token):
            allowed[index] = False
    return allowed.nonzero().squeeze(1)


@dataclass
class LayerOV:
    """One layer's OV factors: the value path per KV group and ``W_O`` per query head with the post-norm gain."""

    path: ValuePath  # x -> value vectors [N, kv, Dv]; ``path.linear`` is W_V [kv, D, Dv] where linear
    w_o: torch.Tensor  # [H, Dv, D] float32, post-attention gain (and centring) folded in
    norm: torch.nn.Module | None  # the layer's input norm (None: attention reads the residual itself)

    @property
    def w_v(self) -> torch.Tensor | None:
        """``W_V`` ``[kv, D, Dv]`` float32 where the value path is linear (not MLA's normed latent)."""
        return None if self.path.linear is None else self.path.linear.detach().float().cpu()

    def values(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[kv, N, Dv]`` value vectors of normalised inputs ``[N, D]``, without the value bias
        (a bias writes the same logits whatever the head attends to, as in TransformerLens' OV)."""
        w_v = self.w_v
        if w_v is not None:
            return torch.einsum("nd,gde->gne", inputs, w_v)
        with torch.inference_mode():
            out = torch.cat([self.path(chunk).float().cpu() for chunk in inputs.split(4096)])
        return out.transpose(0, 1).contiguous()

    def head(self, head: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_V of the head's KV group, W_O of the head); linear value paths only."""
        w_v = self.w_v
        if w_v is None:
            raise RunFailure("this layer's value path is not linear (MLA); it has no W_V matrix")
        return w_v[head // group_size], self.w_o[head]

    def matrix(self, head: int, group_size: int) -> torch.Tensor:
        """The head's OV matrix ``[D, D]`` (for checks; the scores never form it)."""
        w_v, w_o = self.head(head, group_size)
        return w_v @ w_o


class Circuits:
    """A model's OV circuits, the folded unembedding and the embeddings the heads read."""

    def __init__(self, loaded: Any) -> None:
        if not loaded.has_lm_head:
            raise InputError(
                f"{loaded.name} has no LM head: the OV token tests read logits, so weights scores nothing here"
            )
        self.loaded = loaded
        layout = loaded.layout
        self.layout = layout
        self.blocks = anatomy.blocks(loaded.model)
        self.final = FrozenNorm.of(anatomy.final_norm(loaded.model))
        w_u, _ = unembedding(loaded)
        self.unembed = self._fold(w_u.detach())  # [V, D] float32

    def _fold(self, w_u: torch.Tensor) -> torch.Tensor:
        rows = []
        for start in range(0, w_u.shape[0], 16384):
            rows.append(self.final.fold(w_u[start : start + 16384].cpu()).float())
        return torch.cat(rows)

    def layer(self, index: int) -> LayerOV:
        layout = self.layout
        block = self.blocks[index]
        attention = projections.attention_module(block)
        path = projections.value_path(attention, anatomy.text_config(self.loaded.model.config))
        w_o, _ = projections.output_projection(attention, layout.n_heads)
        w_o = w_o.detach().float().cpu()
        post = anatomy.post_attention_norm(block)
        if post is not None:
            frozen = FrozenNorm.of(post, f"post-attention norm of layer {index}")
            w_o = w_o * frozen.gain.float()
            if frozen.centred:
                w_o = w_o - w_o.mean(-1, keepdim=True)
        return LayerOV(path, w_o.contiguous(), projections.input_norm(block))

    def embeddings(
        self, ids: torch.Tensor, embedding: Embedding, batch_size: int = 256
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw, effective) embeddings ``[N, D]`` float32 of ``ids``; effective is raw for ``raw``."""
        module = self.loaded.model.get_input_embeddings()
        device = self.loaded.device
        with torch.inference_mode():
            raw = torch.cat([module(chunk.to(device)).float().cpu() for chunk in ids.split(4096)])
        if embedding == "raw":
            return raw, raw
        return raw, self._after_block0(ids, batch_size)

    def _after_block0(self, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
        """The residual after block 0 for each token alone in its sequence (it attends to itself)."""
        from headscope.capture import block_outputs

        loaded = self.loaded
        rows = [[int(i)] for i in ids.tolist()]
        batches = make_batches(
            rows, [[False]] * len(rows), batch_size=batch_size, pad_id=0, is_causal=loaded.is_causal
        )
        out = torch.empty(len(rows), self.layout.d_model)

        def keep(hidden: torch.Tensor, batch: Any) -> None:
            out[batch.example_index.cpu()] = hidden[:, 0].float().cpu()

        block_outputs(loaded, batches, 0, keep)
        return out

    def layer_inputs(
        self, layer: LayerOV, index: int, raw: torch.Tensor, effective: torch.Tensor
    ) -> torch.Tensor:
        """``norm_l(e)`` for the tokens: what the layer's heads read, ``[N, D]`` float32."""
        source = raw if index == 0 else effective
        if layer.norm is None:  # OLMo 2: attention reads the residual stream itself
            return source.float()
        param = next(layer.norm.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        dtype = param.dtype if param is not None else torch.float32
        with torch.inference_mode():
            return torch.cat(
                [
                    layer.norm(chunk.to(device=device, dtype=dtype)).float().cpu()
                    for chunk in source.split(4096)
                ]
            )


# --- the token tests, exact over the whole candidate vocabulary, with early stopping ------------------

FIRST_CHUNK = 1024
LAST_CHUNK = 32768


@dataclass(frozen=True)
class Candidates:
    """The vocabulary a row's own logit is ranked in, laid out in a fixed random visiting order."""

    ids: torch.Tensor  # [C] token ids, in visiting order
    rows: torch.Tensor  # [C, D] their folded unembedding rows, contiguous, in the same order
    position: torch.Tensor  # [V] where each token id sits in ``ids`` (-1: not a candidate)

    @classmethod
    def of(cls, ids: torch.Tensor, unembed: torch.Tensor, generator: torch.Generator) -> Candidates:
        ordered = ids[torch.randperm(len(ids), generator=generator)]
        position = torch.full((unembed.shape[0],), -1, dtype=torch.long)
        position[ordered] = torch.arange(len(ordered))
        return cls(ordered, unembed[ordered].contiguous(), position)

    def __len__(self) -> int:
        return len(self.ids)


def rank_tests(
    values: torch.Tensor,
    w_o: torch.Tensor,
    own_rows: torch.Tensor,
    own: torch.Tensor,
    candidates: Candidates,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each row's own token is among the ``k`` highest (lowest) logits of the candidates.

    ``values`` ``[N, Dh]`` are the rows' value vectors, ``w_o`` ``[Dh, D]`` the head's output map,
    ``own`` ``[N]`` the rows' token ids (each one a candidate) and ``own_rows`` ``[N, D]`` their
    folded unembedding rows.

    A row is settled for the top-k test once ``k`` candidates reach its own logit, and for the
    bottom-k test once ``k`` fall to it. The candidates are visited in their fixed random order, in
    chunks that double in size: a row whose own token ranks in the middle settles after the first
    chunk, and only rows near the top or bottom are read against the whole vocabulary. The result
    is exact; ties count against the row.
    """
    n = values.shape[0]
    d_head, d_model = w_o.shape
    outputs = values @ w_o  # [N, D]
    own_logit = (outputs * own_rows).sum(-1)  # [N]
    own_at = candidates.position[own]  # [N]
    above = torch.zeros(n, dtype=torch.long)
    below = torch.zeros(n, dtype=torch.long)
    active = torch.arange(n)
    start, size, total = 0, FIRST_CHUNK, len(candidates)
    while start < total and len(active):
        block = candidates.rows[start : start + size]  # [c, D], a view
        rows = len(active)
        if d_head * (d_model + rows) < d_model * rows:  # cheaper factored through the head dimension
            logits = values[active] @ (w_o @ block.T)
        else:
            logits = outputs[active] @ block.T
        at = own_at[active] - start
        inside = (at >= 0) & (at < block.shape[0])
        logits[inside.nonzero().squeeze(1), at[inside]] = float("nan")  # the own token is not a rival
        s = own_logit[active, None]
        above[active] += (logits >= s).sum(1)
        below[active] += (logits <= s).sum(1)
        active = active[(above[active] < k) | (below[active] < k)]
        start += size
        size = min(2 * size, LAST_CHUNK)
    return above < k, below < k


def eigen_score(w_v: torch.Tensor, w_o: torch.Tensor, gram: torch.Tensor) -> float:
    """Σ Re λ / Σ |λ| of the head's full circuit on the sampled tokens, on the Dh × Dh product.

    ``gram`` is ``X^T W`` ``[D, D]`` (X: the tokens' normalised inputs, W: their folded unembedding
    rows), so the circuit ``X W_V W_O W^T`` (N × N) has the nonzero eigenvalues of
    ``W_O W^T X W_V`` (Dh × Dh).
    """
    product = w_o.double() @ gram.double().T @ w_v.double()  # [Dh, Dh]
    eig = torch.linalg.eigvals(product)
    magnitude = eig.abs().sum()
    if float(magnitude) == 0.0:
        return 0.0
    return float(eig.real.sum() / magnitude)


def successor_hits(
    values: torch.Tensor,
    w_o: torch.Tensor,
    unembed: torch.Tensor,
    tasks: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Per pair: is the successor the argmax of the head's output among its task's tokens?

    ``values`` are the value vectors of every pair's source token, in pair order; ``tasks`` gives per
    task ``(rows, task token ids, index of each row's successor among them)``.
    """
    hits = torch.zeros(values.shape[0], dtype=torch.bool)
    for rows, tokens, successor in tasks:
        logits = (values[rows] @ w_o) @ unembed[tokens].T  # [pairs, task size]
        hits[rows] = logits.argmax(-1) == successor
    return hits

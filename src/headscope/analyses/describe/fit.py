"""Describing heads: the streamed statistics, the fit, and the explained share.

**The measure.** For head h at query q a description predicts
``P[q, ·] = Σ_t w_t · P_t[q, ·]`` (``w_t ≥ 0``, ``Σ w_t ≤ 1``; the weights may depend on the
query's class), where ``P_t[q, ·]`` is template t's distribution over the keys the layer's mask
leaves visible (nothing where t has no target at q). The **explained share** at q is
``Σ_k min(A[q, k], P[q, k])`` (1 − total variation when P sums to 1); a head's is the mean over
its queries, the model's the mean over heads. Off the first token it is
``Σ_q Σ_{k≥1} min(A, P) / Σ_q Σ_{k≥1} A`` (a ratio of sums over the queries, so that a query
with almost nothing off the first token weighs almost nothing).

**The fit** (fit split only). One streamed pass accumulates, per layer, query class and head,
``b_t = Σ_q Σ_k A[q,k] P_t[q,k]`` and, per layer and class (heads share it), the Gram matrix
``G_ts = Σ_q Σ_k P_t P_s``: the least-squares problem ``min_w ‖A − Σ w_t P_t‖²`` over the fit
queries. Templates are chosen greedily (at most ``max_templates`` per class, each step the one
that lowers the squared error most), the weights by projected gradient under ``w ≥ 0, Σ w ≤ 1``,
and then scaled to sum to 1: the explained share can only grow with any weight, so a description
that leaves weight unassigned gives away share for nothing. A head is described per query class
when that lowers its squared error on the fit split by ``condition_gain`` (10%) or more; classes
with fewer than ``min_class_queries`` fit queries take the head's unconditioned description.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from headscope.capture import Batch

from .templates import QUERY_CLASSES, Rule, Template, Text, template_targets

N_CLASSES = len(QUERY_CLASSES)


BLOCK = 16  # consecutive query rows per sampled block (each block is one exact span per layer)
EXCERPT = 48  # at most this many tokens of an evaluation window are drawn as a head's heatmaps
_CACHE_BYTES = 256 << 20  # template maps kept per batch (every layer of a batch reads the same ones)
_NO_TARGETS = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))


class RowSample:
    """The query rows a describe pass reads: ``rows`` per window, in blocks of :data:`BLOCK`
    consecutive queries laid out systematically (a random offset, then every ``stride``), drawn
    once per batch from ``seed`` and shared by the batch's windows (so the capture computes exact
    weights for those rows only, in a few spans, and runs the rest through the fused kernel).

    Every position has the same chance ``BLOCK / stride`` to be read, so a window's mean over its
    read queries is an unbiased estimate of its mean over all its queries: the measure (the mean
    over the head's queries) is unchanged, the sample is its estimator. ``rows`` None, or at least
    the batch's length: every row (the exact value)."""

    def __init__(self, rows: int | None, seed: int = 0, salt: int = 0) -> None:
        self.rows, self.seed, self.salt = rows, seed, salt

    def every_row(self, length: int) -> bool:
        return self.rows is None or self.rows >= length

    def __call__(self, batch: Batch) -> torch.Tensor:
        """``[B, T]`` True at the rows read (real tokens only)."""
        key = f"describe-rows:{id(self)}"
        if key not in batch._cache:
            real = batch.attention_mask.bool()
            first = int(batch.example_index.min()) if len(batch.example_index) else 0
            batch._cache[key] = real & self.read(real.shape[1], first).to(real.device)[None, :]
        return batch._cache[key]

    def read(self, length: int, first: int) -> torch.Tensor:
        """``[length]`` True at the positions read in a batch of ``length`` positions whose first
        example is ``first``: what a pass will read, known before it (checks that refuse up front)."""
        if self.every_row(length):
            return torch.ones(length, dtype=torch.bool)
        rows = max(1, int(self.rows))  # type: ignore[arg-type]
        block = min(BLOCK, rows)
        stride = max(block, round(length * block / rows))
        offset = int(np.random.default_rng((self.seed, self.salt, first)).integers(stride))
        return (torch.arange(length) - offset).remainder(stride) < block


def excerpt_span(length: int) -> tuple[int, int]:
    """``(start, stop)`` of a window's excerpt (the queries its heatmaps draw): its middle
    :data:`EXCERPT` tokens, and at most an eighth of the window, so that the rows read for the
    heatmaps stay a small part of the rows the evaluation pass computes exactly; never the first
    token (its column is drawn beside every excerpt instead)."""
    n = max(1, min(EXCERPT, length // 8, length - 1))
    start = max(1, (length - n) // 2)
    return start, min(start + n, length)


class ExcerptRows:
    """The query rows of each window's excerpt (:func:`excerpt_span`), as a capture reader's
    ``reads``: ``[B, T]`` True at them."""

    def __init__(self, texts: Sequence[Text]) -> None:
        self.spans = [excerpt_span(len(t)) for t in texts]

    def __call__(self, batch: Batch) -> torch.Tensor:
        out = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
        for row, example in enumerate(batch.example_index.tolist()):
            start, stop = self.spans[example]
            out[row, start:stop] = True
        return out & batch.attention_mask.bool()


class TemplateMaps:
    """Each template's target weights for one chunk of a batch (``[templates, B, c, K']``), and
    normalised over the keys a layer's mask leaves visible. A template given by a :class:`Rule`
    (the dense ones) is drawn into the chunk by its rule; the others' targets are listed once per
    window. The chunks of the current batch are kept (within :data:`_CACHE_BYTES`): every layer
    reads them."""

    def __init__(self, templates: Sequence[Template], texts: Sequence[Text]) -> None:
        self.templates = list(templates)
        self.texts = texts
        self._rules = [(i, t.targets) for i, t in enumerate(self.templates) if isinstance(t.targets, Rule)]
        self._targets: dict[int, tuple[np.ndarray, ...]] = {}
        self._batch: int | None = None
        # (q_start, stop, keys) -> (raw, [(visible, normed, by_query or None)])
        self._chunks: dict[tuple[int, int, int], tuple[torch.Tensor, list[list[Any]]]] = {}
        self._bytes = 0

    def targets(self, example: int) -> tuple[np.ndarray, ...]:
        """``(template, query, key, weight)`` of the listed templates' targets in one window (not
        the rules'), by query."""
        if example not in self._targets:
            text = self.texts[example]
            ruled = {i for i, _ in self._rules}
            parts = [
                _NO_TARGETS if i in ruled else template_targets(template, text)
                for i, template in enumerate(self.templates)
            ]
            t = np.concatenate([np.full(len(q), i, dtype=np.int64) for i, (q, _, _) in enumerate(parts)])
            q, k, w = (np.concatenate([np.asarray(p[j]) for p in parts]) for j in range(3))
            order = np.argsort(q, kind="stable")
            self._targets[example] = (
                t[order],
                q[order].astype(np.int64),
                k[order].astype(np.int64),
                w[order].astype(np.float64),
            )
        return self._targets[example]

    def named(self, example: int) -> np.ndarray:
        """``[templates]`` bool: whether each template names a key at some query of one window
        after its first token."""
        text = self.texts[example]
        t, q, _, _ = self.targets(example)
        queries = (q > 0) & text.content[q] if len(q) else np.zeros(0, dtype=bool)
        out = np.bincount(t[queries], minlength=len(self.templates)) > 0
        n = len(text)
        for i, rule in self._rules:  # a block of queries at a time: most name a key in the first
            out[i] = any(rule.grid(text, a, min(n, a + BLOCK), n).any() for a in range(1, n, BLOCK))
        return out

    def _chunk(
        self, batch: Batch, q_start: int, stop: int, keys: int
    ) -> tuple[torch.Tensor, list[list[Any]]]:
        if self._batch != id(batch):
            self._batch, self._chunks, self._bytes = id(batch), {}, 0
        key = (q_start, stop, keys)
        if key in self._chunks:
            return self._chunks[key]
        rows = batch.input_ids.shape[0]
        out = torch.zeros(len(self.templates), rows, stop - q_start, keys, dtype=torch.float32)
        for row, example in enumerate(batch.example_index.tolist()):
            for i, rule in self._rules:
                out[i, row] = torch.from_numpy(rule.grid(self.texts[example], q_start, stop, keys))
            t, q, k, w = self.targets(example)
            lo, hi = np.searchsorted(q, q_start), np.searchsorted(q, stop)
            if hi <= lo:
                continue
            tt, qq, kk, ww = t[lo:hi], q[lo:hi], k[lo:hi], w[lo:hi]
            inside = kk < keys
            out[:, row].index_put_(
                (
                    torch.from_numpy(tt[inside]),
                    torch.from_numpy(qq[inside] - q_start),
                    torch.from_numpy(kk[inside]),
                ),
                torch.from_numpy(ww[inside]).float(),
                accumulate=True,
            )
        entry: tuple[torch.Tensor, list[list[Any]]] = (out, [])
        size = out.numel() * out.element_size()
        if self._bytes + 3 * size <= _CACHE_BYTES:  # raw, normalised, and laid out by query
            self._chunks[key] = entry
            self._bytes += 3 * size
        else:  # too big to keep: only this chunk, as before
            self._chunks = {key: entry}
            self._bytes = 3 * size
        return entry

    def raw(self, batch: Batch, q_start: int, stop: int, keys: int) -> torch.Tensor:
        return self._chunk(batch, q_start, stop, keys)[0]

    def normalised(self, batch: Batch, q_start: int, stop: int, keys: int) -> tuple[torch.Tensor, int, bool]:
        """``(P [templates, B, c, K'], which, new)``: the distributions under this layer's mask.
        ``which`` numbers the distinct masks seen for this chunk (layers with the same mask share
        one); ``new`` is True the first time a mask is seen."""
        raw, seen = self._chunk(batch, q_start, stop, keys)
        visible = batch.visible(q_start, stop, keys)
        for which, entry in enumerate(seen):
            if entry[0].shape == visible.shape and torch.equal(entry[0], visible):
                return entry[1], which, False
        masked = raw * visible[None].to(raw.dtype)
        total = masked.sum(-1, keepdim=True)
        normed = torch.where(total > 0, masked / total.clamp(min=1e-30), masked)
        seen.append([visible.clone(), normed, None])
        return normed, len(seen) - 1, True

    def by_query(self, normed: torch.Tensor) -> torch.Tensor:
        """``normed`` laid out ``[B, c, K', templates]`` (contiguous), for one matmul per query row;
        kept for the layers that share the mask."""
        for _, seen in self._chunks.values():
            for entry in seen:
                if entry[1] is normed:
                    if entry[2] is None:
                        entry[2] = normed.permute(1, 2, 3, 0).contiguous()
                    return entry[2]
        return normed.permute(1, 2, 3, 0).contiguous()


def query_classes(
    batch: Batch, texts: Sequence[Text], q_start: int, stop: int, sample: RowSample | None = None
) -> torch.Tensor:
    """``[B, c]`` each query's class (-1: not a query: special, padding, position 0, or a row the
    ``sample`` does not read)."""
    key = f"describe-classes:{q_start}:{stop}:{id(sample) if sample is not None else ''}"
    if key not in batch._cache:
        rows = batch.input_ids.shape[0]
        out = torch.full((rows, stop - q_start), -1, dtype=torch.long)
        for row, example in enumerate(batch.example_index.tolist()):
            classes = texts[example].query_classes()
            part = classes[q_start:stop]
            out[row, : len(part)] = torch.from_numpy(part)
        if q_start == 0:
            out[:, 0] = -1
        if sample is not None:
            read = sample(batch)[:, q_start:stop].to(out.device)
            out = torch.where(read, out, torch.full_like(out, -1))
        batch._cache[key] = out
    return batch._cache[key]


class FitStats:
    """The least-squares statistics of the fit split, streamed per chunk (over the rows ``sample``
    reads; None: every row)."""

    def __init__(
        self,
        maps: TemplateMaps,
        texts: Sequence[Text],
        n_layers: int,
        n_heads: int,
        sample: RowSample | None = None,
    ) -> None:
        n_t = len(maps.templates)
        self.maps, self.texts, self.sample = maps, texts, sample
        self.b = torch.zeros(n_layers, N_CLASSES, n_heads, n_t, dtype=torch.float64)
        self.gram = torch.zeros(n_layers, N_CLASSES, n_t, n_t, dtype=torch.float64)
        self.sq = torch.zeros(n_layers, N_CLASSES, n_heads, dtype=torch.float64)
        self.counts = torch.zeros(N_CLASSES, dtype=torch.float64)
        self.hits = torch.zeros(N_CLASSES, n_t, dtype=torch.float64)  # queries where t has a target
        self._grams: dict[tuple[Any, ...], torch.Tensor] = {}
        self._first_layer: int | None = None

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int) -> None:
        stop = q_start + attn.shape[2]
        keys = attn.shape[3]
        probs, which, new = self.maps.normalised(batch, q_start, stop, keys)
        classes = query_classes(batch, self.texts, q_start, stop, self.sample)
        onehot = torch.nn.functional.one_hot(classes.clamp(min=0), N_CLASSES).double()
        onehot = onehot * (classes >= 0)[..., None].double()  # [B, c, C]
        a = attn.float()
        b = torch.matmul(a.transpose(1, 2), self.maps.by_query(probs)).double()  # [B, c, H, T]
        self.b[layer] += torch.einsum("bqc,bqht->cht", onehot, b)
        self.sq[layer] += torch.einsum("bqc,bhq->ch", onehot, a.pow(2).sum(-1).double())
        key = (id(batch), q_start, stop, keys, which)
        if new or key not in self._grams:
            # Per class, summed over the chunk's queries: kept for every chunk of the batch (the
            # layers that share a mask share it).
            self._grams = {k: v for k, v in self._grams.items() if k[0] == id(batch)}
            self._grams[key] = _class_grams(probs, classes)
        self.gram[layer] += self._grams[key]
        if self._first_layer is None:
            self._first_layer = layer
        if layer == self._first_layer:
            self.counts += onehot.sum((0, 1))
            has = (probs.sum(-1) > 0).double()  # [t, B, c]
            self.hits += torch.einsum("bqc,tbq->ct", onehot, has)


def _class_grams(probs: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``[C, T, T]``: per query class, ``Σ_q Σ_k P_t[q, k] P_s[q, k]`` over the chunk's queries of
    that class (``probs [T, B, c, K']``, ``classes [B, c]``): one matmul per class."""
    n_t, keys = probs.shape[0], probs.shape[-1]
    flat = probs.reshape(n_t, -1, keys)
    which = classes.reshape(-1)
    out = torch.zeros(N_CLASSES, n_t, n_t, dtype=torch.float64)
    for c in range(N_CLASSES):
        at = torch.nonzero(which == c).flatten()
        if len(at):
            part = flat[:, at].reshape(n_t, -1)
            out[c] = (part @ part.T).double()
    return out


# --- fitting --------------------------------------------------------------------------------------


def _project(w: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row onto {w ≥ 0, Σ w ≤ 1}."""
    clipped = w.clamp(min=0)
    over = clipped.sum(-1) > 1
    if not over.any():
        return clipped
    v = w[over]
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = u.cumsum(-1) - 1
    ind = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype)
    cond = u - css / ind > 0
    rho = cond.to(torch.long).cumsum(-1).argmax(-1, keepdim=True)
    theta = css.gather(-1, rho) / (rho + 1).to(v.dtype)
    out = clipped.clone()
    out[over] = (v - theta).clamp(min=0)
    return out


def solve(gram: torch.Tensor, b: torch.Tensor, iterations: int = 300, tol: float = 1e-9) -> torch.Tensor:
    """``argmin_w wᵀ G w − 2 bᵀ w`` under ``w ≥ 0, Σ w ≤ 1``, batched over the leading dims
    (accelerated projected gradient; it stops early once no weight moves by more than ``tol``)."""
    step = 1.0 / (2 * torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1).clamp(min=1e-12))[..., None]
    w = torch.zeros_like(b)
    y, t = w.clone(), 1.0
    for i in range(iterations):
        grad = 2 * (torch.einsum("...ij,...j->...i", gram, y) - b)
        new = _project(y - step * grad)
        t_next = (1 + (1 + 4 * t * t) ** 0.5) / 2
        y = new + ((t - 1) / t_next) * (new - w)
        if i % 20 == 19 and float((new - w).abs().max()) < tol:
            return new
        w, t = new, t_next
    return w


def objective(gram: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.einsum("...i,...ij,...j->...", w, gram, w) - 2 * (b * w).sum(-1)


def greedy(gram: torch.Tensor, b: torch.Tensor, usable: torch.Tensor, max_templates: int) -> torch.Tensor:
    """Forward selection (matching pursuit): ``gram [N, T, T]``, ``b [N, T]`` -> weights ``[N, T]``
    with at most ``max_templates`` non-zero. Each step adds the template whose one-dimensional step
    along the residual lowers the squared error most (``max(b − G w, 0)_t² / G_tt``), then refits
    the chosen ones under ``w ≥ 0, Σ w ≤ 1``. ``usable`` (``[T]``, or ``[N, T]`` per problem) marks
    templates with a target somewhere."""
    n, n_t = b.shape
    diagonal = torch.diagonal(gram, dim1=-2, dim2=-1)
    open_ = (usable if usable.dim() == 2 else usable[None, :]).expand(n, n_t) & (diagonal > 1e-12)
    weights = torch.zeros(n, n_t, dtype=b.dtype)
    chosen = torch.zeros(n, 0, dtype=torch.long)
    rows = torch.arange(n)
    for _ in range(max_templates):
        residual = b - torch.einsum("nij,nj->ni", gram, weights)
        gain = residual.clamp(min=0).pow(2) / diagonal.clamp(min=1e-12)
        gain = gain.masked_fill(~open_, -1.0)
        pick = gain.argmax(-1)
        useful = gain[rows, pick] > 1e-12
        if not useful.any():
            break
        # A head with nothing left to gain repeats a template it has (its weight does not change).
        repeat = chosen[:, 0] if chosen.shape[1] else pick
        pick = torch.where(useful, pick, repeat)
        open_ = open_.clone()
        open_[rows, pick] = False
        chosen = torch.cat([chosen, pick[:, None]], -1)
        sub_gram = gram[rows[:, None, None], chosen[:, :, None], chosen[:, None, :]]
        sub_b = b[rows[:, None], chosen]
        first = torch.ones(chosen.shape, dtype=torch.bool)
        for k in range(1, chosen.shape[1]):  # a repeated template counts once
            first[:, k] = ~(chosen[:, :k] == chosen[:, k : k + 1]).any(-1)
        sub_gram = sub_gram * (first[:, :, None] & first[:, None, :])
        sub_gram = sub_gram + torch.diag_embed((~first).to(b.dtype))
        sub_b = sub_b * first
        found = solve(sub_gram, sub_b, iterations=400) * first
        weights = torch.zeros(n, n_t, dtype=b.dtype).scatter_add_(1, chosen, found)
    return weights


def tidy(weights: torch.Tensor, floor: float = 0.02) -> torch.Tensor:
    """Weights scaled to sum to 1, components below ``floor`` dropped (and the rest rescaled)."""
    total = weights.sum(-1, keepdim=True)
    out = torch.where(total > 0, weights / total.clamp(min=1e-12), weights)
    out = torch.where(out < floor, torch.zeros_like(out), out)
    total = out.sum(-1, keepdim=True)
    return torch.where(total > 0, out / total.clamp(min=1e-12), out)


@dataclass
class Fitted:
    """Per layer: ``weights [L, H, C, T]`` (the description used), ``unconditioned [L, H, T]``,
    ``conditioned [L, H]`` (whether the head's description depends on the query class), and the
    fit split's class counts."""

    weights: torch.Tensor
    unconditioned: torch.Tensor
    conditioned: torch.Tensor
    class_counts: torch.Tensor
    fit_error: torch.Tensor = field(repr=False, default=None)  # type: ignore[assignment]


# A query class gets a description of its own only with at least this many fit queries.
MIN_CLASS_QUERIES = 30


def fit(
    stats: FitStats,
    *,
    max_templates: int = 4,
    min_class_queries: int = MIN_CLASS_QUERIES,
    condition_gain: float = 0.10,
    conditioning: bool = True,
) -> Fitted:
    n_layers, n_classes, n_heads, n_t = stats.b.shape
    usable = stats.hits.sum(0) > 0
    # Unconditioned: every class pooled.
    gram_all = stats.gram.sum(1)  # [L, T, T]
    b_all = stats.b.sum(1)  # [L, H, T]
    # Every problem in one batched greedy call: the pooled description of every head, then one per
    # query class with enough fit queries (each head's problems are independent of the others').
    grams = [gram_all[:, None].expand(n_layers, n_heads, n_t, n_t).reshape(-1, n_t, n_t)]
    bs = [b_all.reshape(-1, n_t)]
    usables = [usable[None].expand(n_layers * n_heads, n_t)]
    classes = [c for c in range(n_classes) if conditioning and stats.counts[c] >= min_class_queries]
    for c in classes:
        grams.append(stats.gram[:, c][:, None].expand(n_layers, n_heads, n_t, n_t).reshape(-1, n_t, n_t))
        bs.append(stats.b[:, c].reshape(-1, n_t))
        usables.append((stats.hits[c] > 0)[None].expand(n_layers * n_heads, n_t))
    found = greedy(torch.cat(grams), torch.cat(bs), torch.cat(usables), max_templates)
    found = found.reshape(1 + len(classes), n_layers, n_heads, n_t)
    w_all = found[0]
    weights = w_all[:, :, None, :].expand(n_layers, n_heads, n_classes, n_t).clone()
    conditioned = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    sq = stats.sq  # [L, C, H]

    def error(gram: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return objective(gram, b, w)

    if conditioning:
        per_class = torch.zeros(n_layers, n_heads, n_classes, n_t, dtype=stats.b.dtype)
        for c in range(n_classes):
            per_class[:, :, c] = found[1 + classes.index(c)] if c in classes else w_all
        # Squared error on the fit split, per head: pooled description against per-class ones.
        err_all = torch.zeros(n_layers, n_heads, dtype=stats.b.dtype)
        err_cls = torch.zeros_like(err_all)
        for c in range(n_classes):
            gram_c = stats.gram[:, c][:, None].expand(n_layers, n_heads, n_t, n_t)
            b_c = stats.b[:, c]
            err_all += sq[:, c] + error(gram_c, b_c, w_all)
            err_cls += sq[:, c] + error(gram_c, b_c, per_class[:, :, c])
        # Conditioned only where it lowers the error by the gain, and by more than rounding
        # (planted heads fitted exactly have errors near 0 both ways).
        gain = err_all - err_cls
        conditioned = (gain >= condition_gain * err_all) & (gain > 1e-3 * sq.sum(1))
        weights = torch.where(conditioned[:, :, None, None], per_class, weights)
    return Fitted(tidy(weights), tidy(w_all), conditioned, stats.counts.clone())


# --- evaluation -----------------------------------------------------------------------------------


class EvalStats:
    """Explained shares of fitted descriptions on the evaluation split, per window and head, and
    what the top-context cards need (each query's strongest key off the first token).

    With ``excerpts`` (the pass must then also read :class:`ExcerptRows`' rows; the shares count
    only the ``sample``'s) it records each window's excerpt for the card's heatmaps, per layer and
    head: the actual attention ``[n, 1 + n]`` of the excerpt's n queries on the first token and on
    the excerpt's own keys, the description's prediction on the same cells, each query's explained
    share over all its keys, and the attention off the first token summed over the excerpt's
    queries (where it is largest is the excerpt the card draws)."""

    def __init__(
        self,
        maps: TemplateMaps,
        texts: Sequence[Text],
        fitted: Fitted,
        n_layers: int,
        n_heads: int,
        sample: RowSample | None = None,
        excerpts: ExcerptRows | None = None,
    ) -> None:
        n_e = len(texts)
        self.maps, self.texts, self.fitted, self.sample = maps, texts, fitted, sample
        self.excerpts = excerpts
        if excerpts is not None:
            sizes = [stop - start for start, stop in excerpts.spans]
            self.excerpt_actual = [
                torch.zeros(n_layers, n_heads, n, n + 1, dtype=torch.float16) for n in sizes
            ]
            self.excerpt_predicted = [torch.zeros_like(m) for m in self.excerpt_actual]
            self.excerpt_explained = [torch.zeros(n_layers, n_heads, n, dtype=torch.float32) for n in sizes]
            self.excerpt_off_first = torch.zeros(n_e, n_layers, n_heads, dtype=torch.float64)
        shape = (n_e, n_layers, n_heads)
        self.explained = torch.zeros(shape, dtype=torch.float64)
        self.explained_plain = torch.zeros(shape, dtype=torch.float64)
        self.off_explained = torch.zeros(shape, dtype=torch.float64)
        self.off_total = torch.zeros(shape, dtype=torch.float64)
        self.first = torch.zeros(shape, dtype=torch.float64)
        self.covered = torch.zeros(shape, dtype=torch.float64)  # attention on the keys P names
        self.counts = torch.zeros(n_e, dtype=torch.float64)
        self.class_counts = torch.zeros(N_CLASSES, dtype=torch.float64)
        self.strongest = [torch.zeros(n_layers, n_heads, len(t), dtype=torch.int32) for t in texts]
        self.strongest_weight = [torch.zeros(n_layers, n_heads, len(t), dtype=torch.float16) for t in texts]
        self._first_layer: int | None = None
        self._w = fitted.weights.float()  # [L, H, C, T]
        self._w_plain = fitted.unconditioned.float()  # [L, H, T]

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int) -> None:
        stop = q_start + attn.shape[2]
        keys = attn.shape[3]
        probs, _, _ = self.maps.normalised(batch, q_start, stop, keys)
        classes = query_classes(batch, self.texts, q_start, stop, self.sample)
        real = (classes >= 0).double()  # [B, c]
        a = attn.float()
        w = self._w[layer].permute(1, 0, 2)[classes.clamp(min=0)]  # [B, c, H, T]
        by_query = self.maps.by_query(probs)  # [B, c, K', T]
        predicted = torch.matmul(w, by_query.transpose(-1, -2)).transpose(1, 2)  # [B, H, c, K']
        overlap = torch.minimum(a, predicted)
        plain = torch.matmul(by_query, self._w_plain[layer].T).permute(0, 3, 1, 2)  # [B, H, c, K']
        rows = batch.example_index

        def add(target: torch.Tensor, per_query: torch.Tensor) -> None:
            target[rows, layer] += (per_query.double() * real[:, None, :]).sum(-1)

        add(self.explained, overlap.sum(-1))
        add(self.explained_plain, torch.minimum(a, plain).sum(-1))
        add(self.off_explained, overlap[..., 1:].sum(-1))
        add(self.off_total, a[..., 1:].sum(-1))
        add(self.first, a[..., 0])
        add(self.covered, (a * (predicted > 0)).sum(-1))
        if self._first_layer is None:
            self._first_layer = layer
        if layer == self._first_layer:
            self.counts.index_add_(0, rows, real.sum(-1))
            self.class_counts += (
                torch.nn.functional.one_hot(classes.clamp(min=0), N_CLASSES)[classes >= 0].sum(0).double()
            )
        if self.excerpts is not None:
            self._record_excerpts(layer, a, by_query, batch, q_start)
        if keys > 1:
            value, where = a[..., 1:].max(-1)  # [B, H, c]
            value = value * (classes >= 0)[:, None, :]  # rows not read (or not queries): no arrow
            for row, example in enumerate(rows.tolist()):
                n = min(stop, len(self.texts[example])) - q_start
                if n <= 0:
                    continue
                self.strongest[example][layer, :, q_start : q_start + n] = (where[row, :, :n] + 1).int()
                self.strongest_weight[example][layer, :, q_start : q_start + n] = value[row, :, :n].half()

    def _record_excerpts(
        self, layer: int, a: torch.Tensor, by_query: torch.Tensor, batch: Batch, q_start: int
    ) -> None:
        """The chunk's excerpt rows of every head: attention and prediction on the excerpt's cells."""
        stop, keys = q_start + a.shape[2], a.shape[3]
        every = query_classes(batch, self.texts, q_start, stop)  # not the sample's: every excerpt row
        for row, example in enumerate(batch.example_index.tolist()):
            start, end = self.excerpts.spans[example]  # type: ignore[union-attr]
            lo, hi = max(start, q_start), min(end, stop)
            if hi <= lo:
                continue
            queries = slice(lo - q_start, hi - q_start)
            classes = every[row, queries]
            actual = a[row, :, queries]  # [H, m, K']
            w = self._w[layer].permute(1, 0, 2)[classes.clamp(min=0)]  # [m, H, T]
            predicted = torch.einsum("mht,mkt->hmk", w, by_query[row, queries])
            predicted = predicted * (classes >= 0)[None, :, None]  # a non-query has no description
            cells = torch.tensor([0, *range(start, min(end, keys))], dtype=torch.long)
            rows = slice(lo - start, hi - start)
            width = len(cells)
            self.excerpt_actual[example][layer, :, rows, :width] = actual[..., cells].half()
            self.excerpt_predicted[example][layer, :, rows, :width] = predicted[..., cells].half()
            self.excerpt_explained[example][layer, :, rows] = torch.minimum(actual, predicted).sum(-1)
            self.excerpt_off_first[example, layer] += actual[..., 1:].sum((-1, -2)).double()


def bootstrap_shares(
    numerator: torch.Tensor, denominator: torch.Tensor, n_resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, tuple[float, float]]:
    """Shares ``Σ_e num / Σ_e den`` per head (``num [E, L, H]``, ``den [E]`` or ``[E, L, H]``), their
    95% bootstrap intervals over windows, and the model's (mean over heads) with its interval."""
    num = numerator.numpy()
    den = denominator.numpy()
    den_full = den if den.ndim == 3 else np.broadcast_to(den[:, None, None], num.shape)
    total = den_full.sum(0)
    # A ratio with nothing under it is undefined (NaN), never 0: a sink head's off-first share.
    point = np.where(total > 0, num.sum(0) / np.where(total > 0, total, 1.0), np.nan)
    n_e = num.shape[0]
    if n_resamples <= 0 or n_e < 2:
        nan = np.full(point.shape, np.nan)
        return (
            point,
            nan,
            nan,
            float(np.nanmean(point)) if np.isfinite(point).any() else float("nan"),
            (
                float("nan"),
                float("nan"),
            ),
        )
    draws = _draws(n_e, n_resamples, seed)
    flat_num = draws @ num.reshape(n_e, -1)
    flat_den = draws @ den_full.reshape(n_e, -1)
    ratio = np.where(flat_den > 0, flat_num / np.where(flat_den > 0, flat_den, 1.0), np.nan)
    resampled = ratio.reshape(n_resamples, *point.shape)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN heads: their interval is NaN
        low, high = np.nanpercentile(resampled, [2.5, 97.5], axis=0)
    model = resampled.reshape(n_resamples, -1).mean(-1)
    m_low, m_high = np.percentile(model, [2.5, 97.5])
    return point, low, high, float(point.mean()), (float(m_low), float(m_high))


def _draws(n_e: int, n_resamples: int, seed: int) -> np.ndarray:
    """``[R, E]`` how often each window is drawn in each bootstrap resample (one seed: every share
    of an atlas is resampled with the same draws)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_e, np.full(n_e, 1.0 / n_e), size=n_resamples).astype(np.float64)


def bootstrap_pooled(
    numerator: torch.Tensor, denominator: torch.Tensor, n_resamples: int, seed: int
) -> tuple[float, tuple[float, float]]:
    """One share pooled over every head: ``Σ_e Σ_h num / Σ_e Σ_h den`` (``[E, L, H]`` each), and its
    95% bootstrap interval over windows (NaN where there is nothing under the ratio)."""
    num = numerator.numpy().reshape(numerator.shape[0], -1).sum(-1)
    den = denominator.numpy().reshape(denominator.shape[0], -1).sum(-1)
    point = float(num.sum() / den.sum()) if den.sum() > 0 else float("nan")
    if n_resamples <= 0 or len(num) < 2 or not np.isfinite(point):
        return point, (float("nan"), float("nan"))
    draws = _draws(len(num), n_resamples, seed)
    resampled_den = draws @ den
    keep = resampled_den > 0
    ratio = (draws @ num)[keep] / resampled_den[keep]
    low, high = np.percentile(ratio, [2.5, 97.5])
    return point, (float(low), float(high))

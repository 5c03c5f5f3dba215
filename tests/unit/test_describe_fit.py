"""The fit recovers planted descriptions, and the explained share is what its definition says.

Heads are planted as exact attention maps built from the templates themselves (a single template,
a 60/40 mixture, a pair conditioned on the query's class) and streamed through the same statistics
as a model's maps, in query chunks: the fit must find the templates and weights within 0.05. A
brute-force numpy computation of the explained share checks the streamed one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.analyses.describe.fit import (
    EvalStats,
    FitStats,
    TemplateMaps,
    bootstrap_shares,
    fit,
    greedy,
    solve,
)
from headscope.analyses.describe.templates import QUERY_CLASSES, chosen_templates, make_text, template_targets
from headscope.capture import make_batches


def _text(name: str, n_words: int, seed: int):
    """BOS, then words with a comma after every third: many punctuation queries."""
    rng = np.random.default_rng(seed)
    words = []
    for i in range(n_words):
        words.append(f"w{rng.integers(40)}")
        if i % 3 == 2:
            words.append(",")
    text = " ".join(words)
    ids, offsets, at = [1], [(0, 0)], 0
    for word in words:
        start = text.index(word, at)
        offsets.append((start, start + len(word)))
        at = start + len(word)
        ids.append(10 + (int(word[1:]) if word != "," else 99))
    return make_text(name, ids, [True] + [False] * len(words), offsets, text, vocab_size=200)


TEMPLATES = chosen_templates(True)
NAMES = [t.name for t in TEMPLATES]
PUNCT = QUERY_CLASSES.index("punctuation")


def planted(probs: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, T]`` attention of four planted heads from the template maps ``[t, B, T, T]``."""

    def p(name: str) -> torch.Tensor:
        return probs[NAMES.index(name)]

    heads = [
        p("offset-1"),  # one template
        0.6 * p("sink") + 0.4 * p("offset-1"),  # a 60/40 mixture
        torch.where((classes == PUNCT)[..., None], p("offset-2"), p("sink")),  # conditioned on the query
        0.7 * p("self") + 0.3 * p("broad"),
    ]
    attn = torch.stack(heads, 1)
    # Rows that are not queries (BOS, padding): all on key 0, as a causal model's BOS row is.
    not_query = (classes < 0)[:, None, :, None]
    first = torch.zeros_like(attn)
    first[..., 0] = 1.0
    return torch.where(not_query, first, attn)


def stream(texts, readers, chunk: int = 16):
    """Every layer's planted maps to ``readers`` in query chunks, as capture.run would."""
    from headscope.analyses.describe.fit import query_classes

    batches = make_batches(
        [t.ids for t in texts], [t.special for t in texts], batch_size=2, pad_id=0, is_causal=True
    )
    for batch in batches:
        length = batch.input_ids.shape[1]
        maps = TemplateMaps(TEMPLATES, texts)
        probs, _, _ = maps.normalised(batch, 0, length, length)
        attn = planted(probs, query_classes(batch, texts, 0, length))
        for layer in range(2):
            for start in range(0, length, chunk):
                stop = min(start + chunk, length)
                for reader in readers:
                    reader.update(layer, attn[:, :, start:stop, :stop].contiguous(), batch, start)
    return batches


@pytest.fixture(scope="module")
def fitted():
    texts = [_text(f"fit{i}", 60, i) for i in range(4)]
    stats = FitStats(TemplateMaps(TEMPLATES, texts), texts, 2, 4)
    stream(texts, [stats])
    return fit(stats, min_class_queries=10)


def weights_of(found, layer: int, head: int, query_class: str = "content-word") -> dict[str, float]:
    row = found.weights[layer, head, QUERY_CLASSES.index(query_class)]
    return {NAMES[t]: float(row[t]) for t in torch.nonzero(row).flatten()}


def test_the_fit_recovers_planted_heads(fitted):
    for layer in range(2):
        one = weights_of(fitted, layer, 0)
        assert one.get("offset-1", 0) == pytest.approx(1.0, abs=0.05), one
        mix = weights_of(fitted, layer, 1)
        assert mix.get("sink", 0) == pytest.approx(0.6, abs=0.05), mix
        assert mix.get("offset-1", 0) == pytest.approx(0.4, abs=0.05), mix
        spread = weights_of(fitted, layer, 3)
        assert spread.get("self", 0) == pytest.approx(0.7, abs=0.05), spread
        assert spread.get("broad", 0) == pytest.approx(0.3, abs=0.05), spread
        assert not fitted.conditioned[layer, 0] and not fitted.conditioned[layer, 1]


def test_the_fit_conditions_on_the_query_class_where_the_head_does(fitted):
    assert bool(fitted.conditioned[0, 2])
    on_punct = weights_of(fitted, 0, 2, "punctuation")
    elsewhere = weights_of(fitted, 0, 2, "content-word")
    assert on_punct.get("offset-2", 0) == pytest.approx(1.0, abs=0.05), on_punct
    assert elsewhere.get("sink", 0) == pytest.approx(1.0, abs=0.05), elsewhere


def test_explained_share_is_one_on_planted_heads_and_matches_brute_force(fitted):
    texts = [_text(f"eval{i}", 50, 10 + i) for i in range(3)]
    measured = EvalStats(TemplateMaps(TEMPLATES, texts), texts, fitted, 2, 4)
    batches = stream(texts, [measured], chunk=7)
    share, *_ = bootstrap_shares(measured.explained, measured.counts, 0, 0)
    assert share.min() > 0.95, share

    # Brute force, in numpy, from whole maps and the templates' targets.
    from headscope.analyses.describe.fit import query_classes

    weights = fitted.weights.numpy()
    total = np.zeros((2, 4))
    off_num, off_den = np.zeros((2, 4)), np.zeros((2, 4))
    queries = 0
    for batch in batches:
        length = batch.input_ids.shape[1]
        probs, _, _ = TemplateMaps(TEMPLATES, texts).normalised(batch, 0, length, length)
        classes = query_classes(batch, texts, 0, length)
        attn = planted(probs, classes).numpy()
        for row, example in enumerate(batch.example_index.tolist()):
            text = texts[example]
            dense = np.zeros((len(TEMPLATES), len(text), len(text)))
            for t, template in enumerate(TEMPLATES):
                q, k, w = template_targets(template, text)
                np.add.at(dense[t], (q, k), w)
            sums = dense.sum(-1, keepdims=True)
            dense = np.divide(dense, sums, out=np.zeros_like(dense), where=sums > 0)
            for q in range(1, len(text)):
                c = text.query_classes()[q]
                queries += 1
                for layer in range(2):
                    for head in range(4):
                        predicted = np.einsum("t,tk->k", weights[layer, head, c], dense[:, q])
                        a = attn[row, head, q, : len(text)]
                        overlap = np.minimum(a, predicted)
                        total[layer, head] += overlap.sum()
                        off_num[layer, head] += overlap[1:].sum()
                        off_den[layer, head] += a[1:].sum()
    np.testing.assert_allclose(share, total / queries, atol=1e-5)
    off, *_ = bootstrap_shares(measured.off_explained, measured.off_total, 0, 0)
    np.testing.assert_allclose(off, off_num / np.maximum(off_den, 1e-12), atol=1e-5)


def test_solve_stays_in_the_capped_simplex():
    gram = torch.eye(3, dtype=torch.float64)[None]
    b = torch.tensor([[2.0, 1.0, -1.0]], dtype=torch.float64)  # unconstrained: (2, 1, -1)
    w = solve(gram, b, iterations=500)
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(w.min()) >= 0
    assert w[0, 0] > w[0, 1] and float(w[0, 2]) == 0.0


def test_greedy_takes_at_most_the_asked_templates():
    rng = torch.Generator().manual_seed(0)
    basis = torch.rand(6, 20, generator=rng, dtype=torch.float64)
    target = 0.5 * basis[0] + 0.3 * basis[2] + 0.2 * basis[5]
    gram = (basis @ basis.T)[None]
    b = (basis @ target)[None]
    w = greedy(gram, b, torch.ones(6, dtype=torch.bool), 2)
    assert int((w > 0).sum()) <= 2
    w3 = greedy(gram, b, torch.ones(6, dtype=torch.bool), 3)
    np.testing.assert_allclose(w3[0].numpy(), [0.5, 0, 0.3, 0, 0, 0.2], atol=0.02)

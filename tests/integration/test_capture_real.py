"""Slow: streaming equals eager on both bundled models, batched equals unbatched, small query chunks
equal one chunk. (The GGUF cache: test_gguf_cache.py.)"""

from __future__ import annotations

import pytest

from headscope import analyses
from headscope.data.prompts import builtin
from headscope.models import load

pytestmark = pytest.mark.slow

TOKEN_LEVEL = ["previous-token", "duplicate-token", "induction", "sink"]


@pytest.mark.parametrize("alias", ["smollm2-135m", "minilm-l6"])
def test_streaming_and_eager_scores_match(alias, request):
    streaming = request.getfixturevalue("smollm2" if alias.startswith("smollm2") else "minilm")
    eager = load(alias, capture="eager")
    assert streaming.capture_mode == "stream" and eager.capture_mode == "eager"
    spec = analyses.RepeatSpec(seq_len=30, n_seqs=4)
    a = analyses.scan(streaming, repeat=spec, detector_names=TOKEN_LEVEL, n_resamples=0).table
    b = analyses.scan(eager, repeat=spec, detector_names=TOKEN_LEVEL, n_resamples=0).table
    assert len(a) == len(b) == 4 * streaming.layout.n_layers * streaming.layout.n_heads
    assert (a.score - b.score).abs().max() < 1e-5


def test_batched_equals_unbatched_on_minilm(minilm):
    one = analyses.scan(minilm, detector_names=TOKEN_LEVEL, batch_size=1, n_resamples=0).table
    many = analyses.scan(minilm, detector_names=TOKEN_LEVEL, batch_size=16, n_resamples=0).table
    assert (one.score - many.score).abs().max() < 1e-5


@pytest.mark.parametrize("alias", ["smollm2-135m", "minilm-l6"])
def test_small_query_chunks_give_the_same_scores(alias, request, monkeypatch):
    """Force many query chunks (and, for the causal model, cut keys) and compare with one chunk."""
    from headscope import capture

    loaded = request.getfixturevalue("smollm2" if alias.startswith("smollm2") else "minilm")
    spec = analyses.RepeatSpec(seq_len=30, n_seqs=4)

    def everything():
        token = analyses.scan(loaded, repeat=spec, detector_names=TOKEN_LEVEL, n_resamples=0).table
        syntax = analyses.syntax(loaded, builtin("syntax/en.conllu"), limit=24, n_resamples=0).table
        return token, syntax

    monkeypatch.setattr(capture.stream, "_CHUNK_ELEMENTS", 1 << 40)
    token_a, syntax_a = everything()
    monkeypatch.setattr(capture.stream, "_CHUNK_ELEMENTS", 4 * 9 * 64)  # a few query rows per chunk
    token_b, syntax_b = everything()
    assert (token_a.score - token_b.score).abs().max() < 1e-5
    # Syntax scores are argmax accuracies; float sums in another order may flip a near tie.
    assert (syntax_a.score - syntax_b.score).abs().max() < 0.02
    assert len(syntax_a) == len(syntax_b) > 0

"""headscope icl on toys whose answers are known: the ICL score, the AIE's patching, the option checks.

* The ground-truth toy (tests/toy/model) copies: on random symbols repeated once, the second copy
  is predicted almost perfectly, so the ICL score (a token of the second copy against a token of the
  first) is about minus the first copy's loss (ln 60 ≈ 4.1). Its induction heads (layer 1) carry
  that: ablating them removes the score, ablating a layer-0 head that is not the previous-token head
  does not.
* The AIE's cached patching equals a full forward pass with the head patched, and on a model in
  which one head alone writes to the residual stream, that head ranks first and every other head's
  effect is exactly 0.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from headscope import capture
from headscope.analyses import icl
from headscope.errors import InputError

SEQ = 30  # random symbols per copy


@pytest.fixture(scope="module")
def repeated_texts(tmp_path_factory):
    rng = random.Random(0)
    texts = []
    for _ in range(12):
        symbols = [f"t{rng.randrange(60)}" for _ in range(SEQ)]
        texts.append(" ".join(symbols + symbols))
    path = tmp_path_factory.mktemp("icl") / "repeated.txt"
    path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    return path


def _score(loaded, path, ablation=None):
    sources = [(str(path), t) for t in icl.read_texts(path)]
    sequences, specials, _ = icl.text_windows(loaded, sources, 2 * SEQ)
    losses = icl.text_losses(loaded, sequences, specials, 2 * SEQ, 4, ablation=ablation)
    # token 10 of the first copy against token 10 of the second (token 40), ±3 tokens
    return icl.icl_score(losses, 10, SEQ + 10, 3, 200, 0)


def test_planted_induction_circuit_carries_the_icl_score(toy, repeated_texts):
    clean = _score(toy, repeated_texts)
    assert (clean.early, clean.late) == (10, SEQ + 10)
    assert clean.score.mean < -3.0 and clean.score.ci[1] < -2.5  # ≈ -ln 60 + the copy's own loss
    assert clean.score.n == 12
    circuit = [(1, h) for h in range(4)]
    removed = _score(toy, repeated_texts, capture.Ablation.of(circuit))
    assert abs(removed.score.mean) < 0.25 * abs(clean.score.mean), removed.score
    other = _score(toy, repeated_texts, capture.Ablation.of([(0, 0)]))
    assert other.score.mean < 0.75 * clean.score.mean, other.score  # still most of it


def test_positions_move_to_what_the_texts_allow():
    loss = np.full((3, 40), 1.0)
    loss[:, 30:] = 0.0
    loss[:, 0] = np.nan  # the first token is never predicted without BOS
    score = icl.icl_score(loss, 5, 500, 2, 0, 0)
    assert (score.early, score.late) == (5, 38)  # 40 tokens, ±2: token 38 is the last with a window
    assert score.requested == (5, 500)
    assert score.score.mean == pytest.approx(-1.0)
    assert "the nearest the texts allow" in score.positions_note()
    with pytest.raises(InputError, match="too short"):
        icl.icl_score(loss[:, :12], 5, 500, 4, 0, 0)


def test_cached_patching_equals_a_full_forward_pass(toy):
    prompt = icl.Prompt("t", toy.tokenizer("t1 t2 t3 t4 t5 t1 t2 t3")["input_ids"], answer=5, query=0)
    means = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with capture.prepared(toy), torch.inference_mode():
        probs = icl._patched_probs(toy, prompt, means, [0, 1])
    modules = icl._output_modules(toy)
    ids = torch.as_tensor(prompt.ids)[None]
    for layer in (0, 1):
        for head in range(4):

            def hook(_module, args, layer=layer, head=head):
                x = args[0].clone()
                x[0, -1, head * 16 : (head + 1) * 16] = means[layer, head].to(x.dtype)
                return (x, *args[1:])

            handle = modules[layer].register_forward_pre_hook(hook)
            try:
                with torch.inference_mode():
                    out = toy.base(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
                    full = torch.softmax(capture.output_logits(toy, out.last_hidden_state[:, -1]), -1)[0, 5]
            finally:
                handle.remove()
            assert float(probs[layer * 4 + head]) == pytest.approx(float(full), abs=1e-5)


def test_the_one_head_that_writes_ranks_first(toy_dir):
    from headscope.models import load

    loaded = load(str(toy_dir))
    carrier = (1, 2)
    with torch.no_grad():
        for layer, module in icl._output_modules(loaded).items():
            for head in range(4):
                if (layer, head) != carrier:
                    module.weight[:, head * 16 : (head + 1) * 16] = 0.0
    # The carrier's "clean mean" writes the answer's unembedding direction: patched in, it raises
    # the answer's probability; a zero mean for every other head cannot change anything they write.
    answer = 7
    w_o = icl._output_modules(loaded)[1].weight[:, 2 * 16 : 3 * 16].double()  # [D, 16]
    target = loaded.model.get_output_embeddings().weight[answer].double() * 8.0
    means = torch.zeros(2, 4, 16, dtype=torch.float64)
    means[1, 2] = torch.linalg.lstsq(w_o, target[:, None]).solution[:, 0]
    prompts = [
        icl.Prompt(
            "t",
            loaded.tokenizer(" ".join(f"t{random.Random(i).randrange(60)}" for _ in range(12)))["input_ids"],
            answer,
            i,
        )
        for i in range(4)
    ]
    effects = icl.indirect_effects(loaded, prompts, means)  # [N, L, H]
    mean = effects.mean(0)
    assert mean[carrier] > 0.05
    others = mean.clone()
    others[carrier] = 0.0
    assert torch.count_nonzero(others.abs() > 1e-9) == 0

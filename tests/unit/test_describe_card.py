"""The rest of describe's card: what each head writes (its OV circuit, read as ``headscope weights``
reads it) and whether it matters (mean ablation on the evaluation windows against random heads of
its layer), in the atlas, its JSON Schema, the terminal and the HTML card."""

from __future__ import annotations

import io
import random
import re

import pytest
import torch
from tiny_models import tiny_bert

import headscope as hs
from headscope.analyses.describe.atlas import Atlas, json_schema
from headscope.analyses.describe.card import (
    add_ablation,
    add_writes,
    check_ablate,
    head_writes,
    matters_line,
    parse_ablate,
    writes_line,
)
from headscope.analyses.describe.present import card_templates, print_atlas
from headscope.analyses.weights import weights
from headscope.errors import InputError
from headscope.weightroles.ov import Circuits, ordinary_ids

SMALL = {"context": 48, "windows": 6, "resamples": 200}


def _repeated_text(path, n=10, length=20, seed=1):
    """Paragraphs of random toy symbols, each segment said twice: the toy's induction circuit
    (previous-token head L0H1, induction heads in layer 1) predicts the second copy."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(n):
        segment = [f"t{rng.randrange(60)}" for _ in range(length)]
        paragraphs.append(" ".join(segment + segment))
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def planted(toy_dir, tmp_path_factory):
    """The toy with layer 0's heads 0, 2 and 3 silenced (their W_O columns zeroed): only L0H1, the
    previous-token head the induction heads read, still writes anything in layer 0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(toy_dir)).eval()
    d_head = model.config.head_dim
    with torch.no_grad():
        o_proj = model.model.layers[0].self_attn.o_proj.weight
        for head in (0, 2, 3):
            o_proj[:, head * d_head : (head + 1) * d_head] = 0
    loaded = hs.load(model, AutoTokenizer.from_pretrained(str(toy_dir)), name="toy-planted")
    text = _repeated_text(tmp_path_factory.mktemp("card") / "repeated.txt")
    atlas = hs.describe(loaded, eval_text=text, **SMALL).atlas
    add_writes(atlas, loaded)
    add_ablation(
        atlas, loaded, _eval_batches(loaded, text), "L0H1,L1H0", n_resamples=SMALL["resamples"], seed=0
    )
    return loaded, atlas


def _eval_batches(loaded, text):
    """describe's evaluation windows of ``text``, batched as its evaluation pass batches them."""
    from headscope.analyses.describe.texts import balanced, user_text_sources, windows
    from headscope.extend.base import model_batches

    texts = balanced(windows(loaded, user_text_sources(text), SMALL["context"]), SMALL["windows"])
    return model_batches(loaded, [t.ids for t in texts], [t.special for t in texts], 4)


def test_the_card_shows_what_weights_reads_for_each_head(toy):
    """copying and suppression are weights' own scores (same sample, same k); the promoted tokens
    are the top of the head's mean write, recomputed here from its OV matrix."""
    per_head, record = head_writes(toy, tokens=60, k=5, top=5, seed=3)
    assert record["reason"] is None and record["tokens"] == 60
    table = weights(toy, tokens=60, k=5, task_sets=[], n_resamples=0, seed=3).table
    for relation, key in (("copying", "copying"), ("suppression", "suppression")):
        rows = table[(table.detector == "weights") & (table.relation == relation)]
        assert len(rows) == 8
        for row in rows.itertuples():
            assert per_head[(int(row.layer), int(row.head))][key] == pytest.approx(row.score, abs=1e-6)
    # The toy's induction heads copy: weights says so, and so does the card.
    assert per_head[(1, 0)]["copying"] > 0.9

    circuits = Circuits(toy)
    candidates = ordinary_ids(toy)
    generator = torch.Generator().manual_seed(3)
    sample = candidates[torch.randperm(len(candidates), generator=generator)[:60]]
    raw, effective = circuits.embeddings(sample, "mlp0")
    for layer in range(2):
        ov = circuits.layer(layer)
        inputs = circuits.layer_inputs(ov, layer, raw, effective)
        for head in range(4):
            write = inputs.mean(0) @ ov.matrix(head, toy.layout.group_size)  # [D]
            logits = circuits.unembed[candidates] @ write
            expected = [int(candidates[i]) for i in torch.topk(logits, 5).indices]
            card = per_head[(layer, head)]
            assert [t["id"] for t in card["promotes"]] == expected
            assert [t["token"] for t in card["promotes"]] == [toy.tokenizer.decode([i]) for i in expected]
            lowest = [int(candidates[i]) for i in torch.topk(-logits, 5).indices]
            assert [t["id"] for t in card["suppresses"]] == lowest
    line = writes_line({"writes": per_head[(1, 0)]})
    assert line.startswith("writes: copies 1.00 of tokens") and "'t" in line


def test_a_head_planted_to_matter_costs_more_than_its_layers_random_heads(planted):
    loaded, atlas = planted
    head = atlas.head(0, 1)["matters"]
    increase = head["loss_increase"]
    assert increase["ci_low"] is not None and increase["ci_low"] > 0.1
    assert increase["ci_low"] <= increase["value"] <= increase["ci_high"]
    # Its layer-mates write nothing, so ablating them changes nothing.
    assert head["random_layer"] == pytest.approx(0.0, abs=1e-6)
    assert sorted(map(tuple, head["random_heads"])) == [(0, 0), (0, 2), (0, 3)]
    assert head["rank_in_layer"] == 1
    assert "matters" not in atlas.head(0, 0)  # only the heads asked for are ablated
    assert atlas.ablation["heads"] == 2 and atlas.ablation["windows"] == SMALL["windows"]
    assert atlas.ablation["controls"] == "random heads of its layer"
    line = matters_line(atlas.head(0, 1))
    assert line.startswith(f"ablating it raises the loss by {increase['value']:.4f} [")
    assert "random heads of its layer: 0.0000" in line


def test_the_atlas_with_writes_and_ablation_validates_and_reads_back(planted):
    import jsonschema

    _, atlas = planted
    data = atlas.to_json()
    assert data["schema"] == "headscope-atlas/2"  # /2 added the optional why blocks (describe --why)
    jsonschema.validate(data, json_schema())
    assert all("writes" in h for h in data["heads"])
    back = Atlas.from_json(data)
    assert back.ablation == atlas.ablation and back.writes == atlas.writes
    broken = {**data, "heads": [{**data["heads"][0], "writes": {"copying": 0.5}}, *data["heads"][1:]]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json_schema())
    # The terminal and the HTML card say both.
    console_text = io.StringIO()
    from rich.console import Console

    print_atlas(atlas, Console(file=console_text, width=300))
    out = console_text.getvalue()
    assert "ablating it raises the loss by" in out and "writes: copies" in out
    page = card_templates(atlas, paint=True)  # the page's cards
    assert "ablating it raises the loss by" in page and "its mean write promotes" in page


def test_a_model_weights_refuses_gets_the_reason_on_every_card():
    loaded = tiny_bert()
    per_head, record = head_writes(loaded)
    assert "has no LM head" in record["reason"]
    assert all(entry == {"reason": record["reason"]} for entry in per_head.values())
    line = writes_line({"writes": per_head[(0, 0)]})
    assert line.startswith("writes: not read: tiny-bert has no LM head") and "\n" not in line


def test_a_failed_conformance_check_is_the_reason(monkeypatch):
    from tiny_models import tiny_gemma

    from headscope.capture import checks
    from headscope.models import anatomy

    loaded = tiny_gemma()
    checks._CACHE.pop(loaded.model, None)
    monkeypatch.setattr(anatomy, "post_attention_norm", lambda block: None)
    _, record = head_writes(loaded)
    assert "direct logit attribution" in record["reason"] and "residual update" in record["reason"]


def test_describe_on_an_encoder_says_why_no_writes(tmp_path):
    text = tmp_path / "words.txt"
    text.write_text("\n\n".join(" ".join(f"w{(i * 7 + j) % 40}" for j in range(20)) for i in range(4)))
    loaded = tiny_bert()
    atlas = hs.describe(loaded, eval_text=text, context=16, windows=2, resamples=0).atlas
    add_writes(atlas, loaded)
    assert "has no LM head" in atlas.writes["reason"]
    page = card_templates(atlas, paint=True)  # the page's cards
    assert page.count("<p class=card-writes>writes: not read: tiny-bert has no LM head") == len(atlas.heads)
    with pytest.raises(InputError, match="--ablate 2: ablation measures next-token loss"):
        check_ablate(loaded, "2")


def test_ablate_values_parse_or_are_refused():
    assert parse_ablate(None) is None and parse_ablate("0") is None
    assert parse_ablate("all") == "all" and parse_ablate("3") == 3
    assert parse_ablate("L1H0, l0h3,L1H0") == [(1, 0), (0, 3)]
    with pytest.raises(InputError, match="'top' is not a head"):
        parse_ablate("top")


@pytest.mark.parametrize(
    ("value", "message"),
    [("L5H0", "has no head L5H0 (2 layers x 4 heads)"), ("9", "--ablate 9: model has 8 heads")],
)
def test_ablate_naming_heads_the_model_lacks_is_refused(toy, value, message):
    with pytest.raises(InputError, match=re.escape(message)):
        check_ablate(toy, value)


def test_a_loss_increase_without_an_interval_says_why():
    from headscope.analyses.describe.card import matters_line

    entry = {"matters": {"loss_increase": {"value": 0.25, "ci_low": None, "ci_high": None}}}
    assert matters_line(entry) == (
        "ablating it raises the loss by 0.2500 nats/token (no interval: fewer than 5 evaluation windows)"
    )


def test_no_interval_says_resamples_0_not_too_few_windows(planted, tmp_path):
    import copy

    loaded, atlas = planted
    again = copy.deepcopy(atlas)
    text = _repeated_text(tmp_path / "repeated.txt")
    batches = _eval_batches(loaded, text)
    windows = 1 + max(int(i) for b in batches for i in b.example_index.tolist())
    assert windows >= 5  # enough for an interval: only resamples=0 leaves it out
    add_ablation(again, loaded, batches, "L0H1", n_resamples=0, seed=0)
    line = matters_line(again.head(0, 1))
    assert "(no interval: resamples=0: no bootstrap was drawn)" in line, line
    assert "fewer than" not in line
    again.to_json()  # the reason is part of the atlas's schema

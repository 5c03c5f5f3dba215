"""`headscope describe` and `hs.describe` on the ground-truth toy: the atlas JSON, the HTML page,
the explained shares against a brute-force computation from the model's own eager maps, and the
refusals (exit 2, one line, before the first forward pass)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from headscope.cli import app

runner = CliRunner()
SMALL = ("--context", 32, "--windows", 4, "--resamples", 200)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def described(toy_dir, toy_texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("describe") / "atlas.json"
    page = out.with_suffix(".html")
    result = invoke(
        "describe", toy_dir, "--eval-text", toy_texts, *SMALL, "--html", page, "--format", "json", "-o", out
    )
    return result, out, page


def test_describe_writes_the_atlas(described):
    result, out, page = described
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    atlas = data["atlas"]
    assert atlas["schema"] == "headscope-atlas/1"
    import jsonschema

    from headscope.analyses.describe.atlas import json_schema

    jsonschema.validate(atlas, json_schema())
    assert len(atlas["heads"]) == 2 * 4
    head = atlas["heads"][0]
    for key in (
        "layer",
        "head",
        "kv_group",
        "explained",
        "explained_off_first",
        "components",
        "dominant",
        "roles",
    ):
        assert key in head
    assert 0 < atlas["explained"]["value"] <= 1
    assert atlas["explained"]["ci_low"] <= atlas["explained"]["value"] <= atlas["explained"]["ci_high"]
    assert all(
        sum(c["weight"] for c in h["components"] if c["query_class"] in ("all", "content-word")) <= 1 + 1e-6
        for h in atlas["heads"]
    )
    assert atlas["evaluation"]["windows"] >= 2 and atlas["fit"]["windows"] >= 2
    # The evaluation text is the user's file; the fit split never reads it.
    assert atlas["evaluation"]["from"].endswith("symbols.txt")
    assert not any("symbols" in s for s in atlas["fit"]["sources"])
    assert "L0H0" in page.read_text(encoding="utf-8")


def test_describe_prints_every_head(toy_dir, toy_texts):
    result = invoke("describe", toy_dir, "--eval-text", toy_texts, *SMALL, "--max-templates", 2)
    assert result.exit_code == 0, result.output
    assert "explained share" in result.output
    for head in ("L0H0", "L0H3", "L1H0", "L1H3"):
        assert head in result.output


def test_explained_share_matches_brute_force_on_eager_maps(toy, toy_dir, toy_texts):
    import headscope as hs
    from headscope.analyses.describe.templates import QUERY_CLASSES, chosen_templates, template_targets
    from headscope.analyses.describe.texts import user_text_sources, windows

    result = hs.describe(toy, eval_text=toy_texts, context=32, windows=4, resamples=0)
    atlas = result.state["atlas"]
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(toy_dir), attn_implementation="eager").eval()
    texts = windows(toy, user_text_sources(toy_texts), 32)[:4]
    templates = chosen_templates(True)
    names = [t.name for t in templates]
    total = np.zeros((2, 4))
    queries = 0
    for text in texts:
        with torch.no_grad():
            maps = eager(torch.tensor([text.ids]), output_attentions=True).attentions
        dense = np.zeros((len(templates), len(text), len(text)))
        for t, template in enumerate(templates):
            q, k, w = template_targets(template, text)
            np.add.at(dense[t], (q, k), w)
        sums = dense.sum(-1, keepdims=True)
        dense = np.divide(dense, sums, out=np.zeros_like(dense), where=sums > 0)
        for q in range(1, len(text)):
            queries += 1
            cls = QUERY_CLASSES[text.query_classes()[q]]
            for layer in range(2):
                for head in range(4):
                    entry = atlas.head(layer, head)
                    weights = np.zeros(len(templates))
                    for c in entry["components"]:
                        if c["query_class"] in ("all", cls):
                            weights[names.index(c["name"])] = c["weight"]
                    predicted = weights @ dense[:, q]
                    total[layer, head] += np.minimum(maps[layer][0, head, q].numpy(), predicted).sum()
    brute = total / queries
    streamed = np.array(
        [[atlas.head(layer, head)["explained"]["value"] for head in range(4)] for layer in range(2)]
    )
    np.testing.assert_allclose(streamed, brute, atol=1e-4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--templates", "sink,nope"), "unknown template nope"),
        (("--lang", "fr"), "--lang fr"),
        (("--max-templates", 5), "5"),
        (("--context", 4000), "context"),
        (("--eval-text", "{tmp}"), "directory"),
    ],
)
def test_refusals_are_one_line(toy_dir, tmp_path, args, message):
    args = tuple(str(a).replace("{tmp}", str(tmp_path)) for a in args)
    result = invoke("describe", toy_dir, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_sweep_records_the_explained_share_by_step(toy_dir, tmp_path):
    import shutil

    import headscope as hs

    root = tmp_path / "run"
    for step in (100, 200):
        shutil.copytree(toy_dir, root / f"step-{step}")
    result = hs.sweep(str(root), tmp_path / "store", analyses="describe", context=32, windows=2, resamples=0)
    losses = result.losses.sort_values("step")
    assert list(losses["step"]) == [100, 200]
    assert losses["explained"].between(0, 1).all()
    assert {"explained_off_first", "dominant_sink"} <= set(losses.columns)
    # The same weights at both steps: the same description and share.
    assert losses["explained"].iloc[0] == pytest.approx(losses["explained"].iloc[1])


def test_compare_lists_heads_whose_description_changed(toy, toy_texts, tmp_path):
    import headscope as hs

    common = {"eval_text": toy_texts, "context": 32, "windows": 2, "resamples": 0}
    one = hs.describe(toy, max_templates=1, **common)
    four = hs.describe(toy, max_templates=4, **common)
    same = hs.compare(one, one)
    assert same.descriptions == []
    changed = hs.compare(one, four)
    assert changed.descriptions, "one template against four: some head's mixture moves"
    for row in changed.descriptions:
        assert row["dominant_a"] != row["dominant_b"] or row["distance"] >= 0.25
    # The same from the command line, on the saved JSON.
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    one.to_json(a)
    four.to_json(b)
    result = invoke("compare", a, b)
    assert result.exit_code == 0, result.output
    assert f"{len(changed.descriptions)} heads changed their description" in result.output


def test_a_registered_template_joins_the_library(toy, toy_texts):
    import numpy as np

    import headscope as hs
    from headscope.analyses.describe.templates import TEMPLATES

    def two_back(text):
        queries = np.arange(2, len(text))
        return queries, queries - 2, np.ones(len(queries))

    hs.register(hs.Template("two-back-mine", "the token two before, again", two_back, "offset"))
    try:
        result = hs.describe(
            toy, eval_text=toy_texts, context=32, windows=2, resamples=0, templates="two-back-mine,sink"
        )
        names = {c["name"] for h in result.atlas.heads for c in h["components"]}
        assert names <= {"two-back-mine", "sink"} and "two-back-mine" in names
    finally:
        TEMPLATES.unregister("two-back-mine")

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
    assert atlas["schema"] == "headscope-atlas/2"
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
    # Each stored run keeps its atlas, so two runs compare head by head.
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    keys = sorted(manifest["runs"])
    assert len(keys) == 2
    runs = [hs.Result.from_json(tmp_path / "store", run=key) for key in keys]
    assert all(r.atlas is not None and len(r.atlas.heads) == 8 for r in runs)
    compared = hs.compare(*runs)
    assert compared.descriptions == []
    # A describe result without its atlas (a store written before it was kept) says so.
    bare = runs[0].to_dict()
    del bare["atlas"]
    compared = hs.compare(hs.Result.from_json(bare), runs[1])
    assert compared.descriptions is None
    assert any("only one result describes its heads" in n for n in compared.notes)
    compared = hs.compare(hs.Result.from_json(bare), hs.Result.from_json(bare))
    assert any("A and B: a describe result without its atlas" in n for n in compared.notes), compared.notes


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


# --- damaged atlases, repeated languages, and inputs that would have been silently wrong -------------


def _damaged_copy(out, tmp_path, name, damage):
    data = json.loads(out.read_text())
    damage(data["atlas"])
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _drop_explained(atlas):
    del atlas["heads"][1]["explained"]


def _twice(atlas):
    atlas["heads"][1] = dict(atlas["heads"][0])


def _weight(atlas):
    atlas["heads"][0]["components"][0]["weight"] = 1.5


def _layer(atlas):
    atlas["heads"][3]["layer"] = 7


def _no_components(atlas):
    for head in atlas["heads"]:
        del head["components"]


def _no_heads(atlas):
    del atlas["heads"]


def _schema(atlas):
    atlas["schema"] = "headscope-atlas/9"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_drop_explained, "atlas.heads[1]: missing 'explained'"),
        (_twice, "atlas.heads[1]: L0H0 again (heads[0])"),
        (_weight, "atlas.heads[0].components[0].weight: 1.5 is above the maximum 1"),
        (_layer, "atlas.heads[3].layer: 7 is outside the 2 layers"),
        (_no_components, "atlas.heads[0]: missing 'components'"),
        (_no_heads, "atlas: missing 'heads'"),
        (_schema, "atlas.schema: 'headscope-atlas/9' is not an atlas this headscope reads"),
    ],
)
def test_a_damaged_atlas_is_refused_by_compare_report_and_the_api(described, tmp_path, damage, message):
    import headscope as hs

    _, out, _ = described
    bad = _damaged_copy(out, tmp_path, "bad.json", damage)
    for args in (
        ("compare", out, bad),
        ("compare", bad, out),
        ("report", bad, "--html", tmp_path / "r.html"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert f"bad.json: {message}" in result.output, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(hs.InputError, match="bad.json: atlas"):
        hs.Result.from_json(bad)


def test_repeated_languages_read_each_window_once(toy):
    from headscope.analyses.describe import Describe, DescribeOptions

    twice = Describe().check(DescribeOptions(lang="en,en"))
    once = Describe().check(DescribeOptions(lang="en"))
    assert [s.name for s in twice.fit_sources] == [s.name for s in once.fit_sources]
    assert [s.name for s in twice.eval_sources] == [s.name for s in once.eval_sources]


def test_a_treebank_given_as_eval_text_is_refused(toy_dir, tmp_path):
    from headscope.data.prompts import configs_dir

    treebank = (configs_dir() / "syntax" / "en.conllu").read_text(encoding="utf-8")
    for name in ("tb.conllu", "tb.txt"):  # by its name, or by its lines
        (tmp_path / name).write_text(treebank, encoding="utf-8")
        result = invoke("describe", toy_dir, "--eval-text", tmp_path / name, *SMALL)
        assert result.exit_code == 2, result.output
        assert f"--eval-text {tmp_path / name}" in result.output or name in result.output
        assert "CoNLL-U" in result.output and "--eval-treebank" in result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("templates", "message"),
    [
        ("offset+1,sep", "--templates offset+1, sep: encoder-only"),
        ("offset-1,offset+2", "--templates offset+2: encoder-only"),
    ],
)
def test_encoder_only_templates_are_refused_on_a_causal_model(toy_dir, templates, message):
    result = invoke("describe", toy_dir, "--templates", templates, *SMALL)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_templates_that_never_apply_are_refused_or_named(toy, toy_texts):
    import numpy as np

    import headscope as hs
    from headscope.analyses.describe.templates import TEMPLATES

    def nothing(text):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)

    def ahead(text):  # keys after the query: a causal model never sees them
        queries = np.arange(1, len(text) - 2)
        return queries, queries + 2, np.ones(len(queries))

    hs.register(hs.Template("never-mine", "names nothing", nothing, "other"))
    hs.register(hs.Template("ahead-mine", "two tokens ahead", ahead, "offset"))
    common = {"eval_text": toy_texts, "context": 32, "windows": 2, "resamples": 0, "writes": False}
    try:
        with pytest.raises(hs.InputError, match=r"no template names a key .* \(never-mine, ahead-mine\)"):
            hs.describe(toy, templates="never-mine,ahead-mine", **common)
        result = hs.describe(toy, templates="never-mine,offset-1,ahead-mine", **common)
        assert [t["name"] for t in result.atlas.templates] == ["offset-1"]
        assert any("never-mine, ahead-mine name no key" in note for note in result.notes)
    finally:
        TEMPLATES.unregister("never-mine")
        TEMPLATES.unregister("ahead-mine")


def test_a_template_given_twice_is_fitted_once(toy, toy_texts):
    import headscope as hs

    common = {"eval_text": toy_texts, "context": 32, "windows": 2, "resamples": 0, "writes": False}
    result = hs.describe(toy, templates="offset-1,sink,offset-1", **common)
    assert [t["name"] for t in result.atlas.templates] == ["offset-1", "sink"]

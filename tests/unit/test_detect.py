"""``hs.detect`` against TransformerLens' ``detect_head``, and TargetDetector declarations.

TransformerLens' scoring function and its three named patterns are copied below (from
``transformer_lens/head_detector.py``), not imported: the test pins their semantics, whatever
version of TransformerLens is around. The attention maps come from transformers itself (eager,
``output_attentions=True``), not from headscope's capture.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope as hs
from headscope import detectors
from headscope.errors import HeadscopeError, InputError

# --- copied from TransformerLens (transformer_lens/head_detector.py), the numpy bits kept ---------


def tl_previous_token(tokens: torch.Tensor) -> torch.Tensor:
    detection_pattern = torch.zeros(tokens.shape[-1], tokens.shape[-1])
    detection_pattern[1:, :-1] = torch.eye(tokens.shape[-1] - 1)
    return torch.tril(detection_pattern)


def tl_duplicate_token(tokens: torch.Tensor) -> torch.Tensor:
    token_pattern = tokens.repeat(tokens.shape[-1], 1).numpy()
    eq_mask = np.equal(token_pattern, token_pattern.T).astype(int)
    np.fill_diagonal(eq_mask, 0)
    detection_pattern = eq_mask.astype(int)
    return torch.tril(torch.as_tensor(detection_pattern).float())


def tl_induction(tokens: torch.Tensor) -> torch.Tensor:
    duplicate_pattern = tl_duplicate_token(tokens)
    shifted_tensor = torch.roll(duplicate_pattern, shifts=1, dims=1)
    zeros_column = torch.zeros(duplicate_pattern.shape[0], 1)
    result_tensor = torch.cat((zeros_column, shifted_tensor[:, 1:]), dim=1)
    return torch.tril(result_tensor)


def tl_score(attention_pattern, detection_pattern, *, exclude_bos, exclude_current_token, error_measure):
    attention_pattern = attention_pattern.clone()  # TransformerLens writes into the cache; we don't
    if error_measure == "mul":
        if exclude_bos:
            attention_pattern[:, 0] = 0
        if exclude_current_token:
            attention_pattern.fill_diagonal_(0)
        score = attention_pattern * detection_pattern
        return (score.sum() / attention_pattern.sum()).item()
    abs_diff = (attention_pattern - detection_pattern).abs()
    size = len(abs_diff)
    if exclude_bos:
        abs_diff[:, 0] = 0
    if exclude_current_token:
        abs_diff.fill_diagonal_(0)
    return 1 - round((abs_diff.mean() * size).item(), 3)


TL_PATTERNS = {
    "previous_token_head": tl_previous_token,
    "duplicate_token_head": tl_duplicate_token,
    "induction_head": tl_induction,
}

# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_maps(toy_dir, toy_texts):
    """The toy's prompts (repeated symbol lines, so duplicates and induction occur), their token
    ids, and transformers' own eager attention maps [L, H, T, T] per prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_dir)
    model = AutoModelForCausalLM.from_pretrained(toy_dir, attn_implementation="eager").eval()
    lines = [line for line in toy_texts.read_text().splitlines() if line.strip()][:5]
    prompts = [line + " " + " ".join(line.split()[:12]) for line in lines]
    ids, maps = [], []
    with torch.no_grad():
        for text in prompts:
            encoded = tokenizer(text, return_tensors="pt")
            out = model(**encoded, output_attentions=True)
            ids.append(encoded["input_ids"][0])
            maps.append(torch.stack([a[0] for a in out.attentions]))
    return prompts, ids, maps


def tl_table(ids, maps, name, **kwargs) -> np.ndarray:
    """TransformerLens' detect_head over a list of prompts: the mean of the per-prompt scores."""
    per_prompt = []
    for tokens, attention in zip(ids, maps, strict=True):
        pattern = TL_PATTERNS[name](tokens)
        layers, heads = attention.shape[:2]
        per_prompt.append(
            [
                [tl_score(attention[layer, head], pattern, **kwargs) for head in range(heads)]
                for layer in range(layers)
            ]
        )
    return np.mean(per_prompt, axis=0)


def scores(result) -> np.ndarray:
    table = result.table.sort_values(["layer", "head"])
    layers, heads = int(table.layer.max()) + 1, int(table["head"].max()) + 1
    return table.score.to_numpy(float).reshape(layers, heads)


@pytest.mark.parametrize("name", list(TL_PATTERNS))
@pytest.mark.parametrize(
    "exclusions",
    [
        dict(exclude_bos=False, exclude_current_token=False),
        dict(exclude_bos=True, exclude_current_token=True),
    ],
)
def test_mul_reproduces_transformer_lens(toy, toy_maps, name, exclusions):
    prompts, ids, maps = toy_maps
    result = hs.detect(toy, None, prompts, name, name="tl-check", resamples=0, **exclusions)
    expected = tl_table(ids, maps, name, error_measure="mul", **exclusions)
    np.testing.assert_allclose(scores(result), expected, atol=2e-5)
    assert np.ptp(scores(result)) > 1e-3  # heads differ: the comparison is not of constants
    if name != "duplicate_token_head":  # the toy has planted previous-token and induction heads
        assert scores(result).max() > 0.3


def test_abs_reproduces_transformer_lens_up_to_its_rounding(toy, toy_maps):
    prompts, ids, maps = toy_maps
    result = hs.detect(toy, None, prompts, "previous_token_head", score="abs", name="tl-abs", resamples=0)
    expected = tl_table(
        ids, maps, "previous_token_head", error_measure="abs", exclude_bos=False, exclude_current_token=False
    )
    # TransformerLens rounds each prompt's error to 3 decimals; headscope keeps every digit.
    np.testing.assert_allclose(scores(result), expected, atol=5e-4 + 1e-5)


def test_a_pattern_as_function_or_tensors_gives_the_same_scores(toy, toy_maps):
    prompts, ids, _ = toy_maps
    named = scores(hs.detect(toy, None, prompts, "induction_head", name="ind-named", resamples=0))
    function = scores(hs.detect(toy, None, prompts, tl_induction, name="ind-fn", resamples=0))
    tensors = scores(hs.detect(toy, None, prompts, [tl_induction(t) for t in ids], name="ind-t", resamples=0))
    np.testing.assert_allclose(named, function, atol=1e-7)
    np.testing.assert_allclose(named, tensors, atol=1e-7)


def test_baseline_interval_and_role_on_the_planted_heads(toy, toy_maps, toy_truth):
    """What detect_head does not give: the uniform reference, an interval, and a role for the
    toy's planted previous-token head (L0H1), none for the layer-1 heads."""
    prompts, ids, _ = toy_maps
    result = hs.detect(
        toy, None, prompts * 4, "previous_token_head", name="prev-tl", label="ptl", resamples=200
    )
    table = result.table.set_index(["layer", "head"])
    layer, head = toy_truth["previous_token_head"]
    planted = table.loc[(layer, head)]
    assert planted.role == "ptl" and planted.ci_low > planted.baseline
    assert set(table.loc[1].role) == {""}
    # Uniform causal attention puts 1/(q+1) on key q-1; "mul" divides by T (every row sums to 1).
    lengths = [len(t) for t in ids] * 4
    expected = np.mean([sum(1 / (q + 1) for q in range(1, n)) / n for n in lengths])
    assert planted.baseline == pytest.approx(expected, abs=1e-6)
    # The role map and legends find the label, as for a built-in.
    from headscope.verdicts.roles import spec_for_label

    assert spec_for_label("ptl").meaning.startswith("prev-tl")


def test_verify_ablates_the_top_heads_against_random_ones(toy):
    """On repeated random symbols (where copying is the only way to predict), ablating the top
    head of the induction pattern costs more next-token loss than a random same-layer head."""
    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(12):
        half = " ".join(f"t{i}" for i in rng.integers(1, 61, size=25))
        prompts.append(f"{half} {half}")
    result = hs.detect(toy, None, prompts, "induction_head", name="ind-v", resamples=200)
    top = result.table.sort_values("score", ascending=False).iloc[0]
    (check,) = result.verify(k=1)
    assert check.value.heads == [(int(top.layer), int(top["head"]))]
    assert top.layer == 1  # the toy's induction heads are its layer-1 heads (ground truth)
    assert check.value.topk_effect > check.value.random_effect


def test_bad_patterns_are_refused_before_scores(toy, toy_maps):
    prompts, ids, _ = toy_maps
    with pytest.raises(InputError, match="prompt 0 has shape"):
        hs.detect(toy, None, prompts, [torch.ones(3, 3)] * len(prompts), name="bad", resamples=0)
    with pytest.raises(InputError, match="above the diagonal"):
        hs.detect(toy, None, prompts[:1], [torch.ones(len(ids[0]), len(ids[0]))], name="bad", resamples=0)
    with pytest.raises(InputError, match="not a named pattern"):
        hs.detect(toy, None, prompts, "induction", name="bad")
    with pytest.raises(InputError, match="built-in detector"):
        hs.detect(toy, None, prompts, "induction_head", name="induction")
    with pytest.raises(InputError, match="finite"):
        hs.detect(toy, None, prompts, "induction_head", name="bad", role_threshold=float("nan"))
    nan = tl_previous_token(ids[0])
    nan[3, 1] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        hs.detect(toy, None, prompts[:1], [nan], name="bad", resamples=0)


def test_a_pattern_detector_never_runs_in_a_scan(toy, toy_maps):
    prompts, _, _ = toy_maps
    hs.detect(toy, None, prompts, "induction_head", name="scan-me", resamples=0)
    assert "scan-me" not in [d.name for d in detectors.create()]
    with pytest.raises(InputError, match="hs.detect"):
        detectors.create(["scan-me"])


# --- TargetDetector ----------------------------------------------------------------------------


def two_back(batch):
    content = batch.content
    rows, earlier = (content[:, 2:] & content[:, :-2]).nonzero(as_tuple=True)
    return rows, earlier + 2, earlier


def two_back_from_eager(texts) -> np.ndarray:
    """[L, H] mean attention from i to i-2 over ordinary tokens, from transformers' eager maps."""
    from conftest import TOY_DIR
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOY_DIR)
    model = AutoModelForCausalLM.from_pretrained(TOY_DIR, attn_implementation="eager").eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for line in texts.read_text().splitlines():
            if not line.strip():
                continue
            encoded = tokenizer(line, return_tensors="pt", return_special_tokens_mask=True)
            ordinary = ~encoded.pop("special_tokens_mask")[0].bool()
            attention = torch.stack([a[0] for a in model(**encoded, output_attentions=True).attentions])
            queries = [q for q in range(2, len(ordinary)) if ordinary[q] and ordinary[q - 2]]
            total = total + sum(attention[:, :, q, q - 2].double() for q in queries)
            count += len(queries)
    return (total / count).numpy()


def test_a_registered_target_detector_runs_in_the_scan_with_role_and_baseline(toy, toy_texts, toy_maps):
    """hs.register puts a declaration beside the built-ins: the scan runs it on its source, and its
    score is the mean attention from i to i-2 as computed from transformers' own maps."""
    detector = hs.TargetDetector(
        "two-back", targets=two_back, summary="attention from i to i-2", role=hs.RoleSpec("two", "two back")
    )
    hs.register(detector)
    try:
        result = hs.scan(toy, detectors="two-back", text=toy_texts, resamples=200, weights=False)
        table = result.table.set_index(["layer", "head"])
        assert set(result.table.detector) == {"two-back"} and (table.baseline > 0).all()
        np.testing.assert_allclose(
            table.score.to_numpy(float), two_back_from_eager(toy_texts).flatten(), atol=1e-5
        )
        # Refusals: a built-in's name, a bad declaration.
        with pytest.raises(InputError, match="built-in"):
            hs.register(hs.TargetDetector("induction", targets=two_back))
        with pytest.raises(InputError, match="not usable"):
            hs.TargetDetector("Two Back", targets=two_back)
        with pytest.raises(InputError, match="source"):
            hs.TargetDetector("two-back-2", targets=two_back, source="treebank")
    finally:
        detectors.REGISTRY.unregister("two-back")


def test_targets_are_checked(toy, toy_texts):
    def after_query(batch):
        return torch.tensor([0]), torch.tensor([1]), torch.tensor([3])

    hs.register(hs.TargetDetector("future", targets=after_query))
    try:
        with pytest.raises(HeadscopeError, match="comes after its query"):
            hs.scan(toy, detectors="future", text=toy_texts, resamples=0, weights=False)
    finally:
        detectors.REGISTRY.unregister("future")


def test_a_detector_with_its_own_prompt_set_is_scored_on_it(toy, toy_texts):
    """source=<prompt-set file>: the scan reads the file before the model loads and scores the
    detector on it as a part of its own; the numbers equal those of the same targets on --text."""
    hs.register(hs.TargetDetector("two-back-own", targets=two_back, source=str(toy_texts)))
    hs.register(hs.TargetDetector("two-back-text", targets=two_back, source="text"))
    try:
        own = hs.scan(toy, detectors="two-back-own", resamples=0, weights=False).table
        text = hs.scan(toy, detectors="two-back-text", text=toy_texts, resamples=0, weights=False).table
        assert set(own.data) == {toy_texts.stem}
        np.testing.assert_array_equal(own.score.to_numpy(float), text.score.to_numpy(float))
        with pytest.raises(HeadscopeError, match="no-such.txt"):
            hs.register(hs.TargetDetector("two-back-missing", targets=two_back, source="no-such.txt"))
            hs.plan("scan", detectors="two-back-missing")
    finally:
        for name in ("two-back-own", "two-back-text", "two-back-missing"):
            if name in detectors.REGISTRY:
                detectors.REGISTRY.unregister(name)

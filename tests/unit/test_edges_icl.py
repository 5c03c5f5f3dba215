"""icl at the edges of what it was asked, from Python, on the ground-truth toy (issue 39).

A reported k-shot accuracy holds exactly k demonstrations per prompt: a shot count a task cannot
fill (``shots``, ``fv_shots``, ``fv_prompts``) is refused before any forward pass, naming the keyword,
the task and how many pairs it has. What is left out on the way (short texts, queries) is said in
the notes. Odd texts and contexts are refused with one line, before the forward passes.

The toy's word-level vocabulary spells ``t0`` … ``t59`` as one token each and everything else as its
unknown token, so a task of ``[tN, tM]`` pairs has single-token answers and ``zzN`` answers do not.
"""

from __future__ import annotations

import random

import pytest

import headscope as hs
from headscope.analyses import icl
from headscope.errors import InputError

SCORE = dict(context=60, early=10, late=40, window=3, resamples=0)


def _task(path, n, *, bad=0, name="toy-task"):
    lines = [f"name: {name}", "lang: en", "description: toy pairs", "pairs:"]
    lines += [f"  - [t{i}, {f'zz{i}' if i < bad else f't{30 + i}'}]" for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("icl-edges")
    rng = random.Random(1)
    texts = []
    for _ in range(5):
        symbols = [f"t{rng.randrange(60)}" for _ in range(30)]
        texts.append(" ".join(symbols + symbols))
    texts[2] = "t1 t2 t3"  # a short paragraph among five: shorter than the late token
    (d / "texts.txt").write_text("\n\n".join(texts), encoding="utf-8")
    (d / "one.txt").write_text("t1", encoding="utf-8")
    return {
        "dir": d,
        "texts": str(d / "texts.txt"),
        "one": str(d / "one.txt"),
        "t12": _task(d / "t12.yaml", 12, name="twelve"),
        "t20": _task(d / "t20.yaml", 20, name="twenty"),
        "t14": _task(d / "t14.yaml", 14, name="fourteen"),
        "bad": _task(d / "bad.yaml", 20, bad=8, name="eight-bad"),
    }


@pytest.fixture
def no_forward_pass(monkeypatch):
    """Any forward pass of icl's run fails the test: the refusal must come first."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("icl ran a forward pass before refusing")

    monkeypatch.setattr(icl, "run_icl", refuse)


def _icl(toy, **options):
    return hs.icl(toy.model, toy.tokenizer, **{**SCORE, **options})


def test_shots_beyond_the_usable_pairs_are_refused_naming_task_and_count(toy, files, no_forward_pass):
    # 20 pairs in the file, 12 whose answer is one token: 15 shots cannot be filled (11 at most).
    with pytest.raises(InputError) as found:
        _icl(toy, text=files["texts"], tasks=files["bad"], shots="0,15", fv=False)
    message = str(found.value)
    assert "shots='0,15'" in message and "eight-bad" in message
    assert "12 usable pairs (of 20" in message and "at most 11 demonstrations" in message


def test_shots_beyond_the_pairs_in_the_file_are_refused_before_loading(files):
    with pytest.raises(InputError, match=r"shots='0,15': task 'twelve' has 12 pairs"):
        hs.plan("icl", tasks=files["t12"], shots="0,15")


def test_fv_shots_and_fv_prompts_the_task_cannot_fill_are_refused(toy, files, no_forward_pass):
    with pytest.raises(InputError, match=r"fv_shots=50: task 'twenty' has 20 pairs.*at most 19"):
        _icl(toy, text=files["texts"], tasks=files["t20"], shots="0", fv_shots=50, k=2)
    with pytest.raises(InputError, match=r"fv_prompts=20: task 'twenty' has 20 pairs"):
        _icl(toy, text=files["texts"], tasks=files["t20"], shots="0", fv_prompts=20, k=2)
    # --no-fv: neither is used, so neither is refused (the run itself is stubbed out above)
    with pytest.raises(AssertionError, match="forward pass"):
        _icl(toy, text=files["texts"], tasks=files["t20"], shots="0", fv=False, fv_shots=50)


def test_a_k_shot_prompt_holds_k_demonstrations(toy, files):
    tasks, _, _ = icl.prepare_tasks(toy, hs_tasks(files["t12"]), 4, 0)
    # Each demonstration is 4 tokens ("Q:" t_x "A:" t_y), the query 3, after BOS.
    for shots in (0, 5, 11):
        prompts = icl.build_prompts(toy, tasks[0], shots, 0)
        assert {len(p.ids) for p in prompts} == {1 + 4 * shots + 3}
    with pytest.raises(InputError, match="at most 11 demonstrations"):
        icl.build_prompts(toy, tasks[0], 12, 0)


def hs_tasks(path):
    from headscope.data.icl import load_tasks

    return load_tasks([path])


def test_left_out_texts_and_queries_are_noted(toy, files):
    result = _icl(toy, text=files["texts"], tasks=files["bad"], shots="0,5", queries=40, fv=False)
    notes = result.notes
    assert any("1 of 5 text(s) left out of the ICL score: shorter than 43 tokens" in n for n in notes), notes
    assert "eight-bad: 12 queries, one per usable pair (asked queries=40)" in notes
    measures = result.to_dict()["icl"]
    assert measures["icl_score"]["texts"] == 4
    assert {(a["shots"], a["n"]) for a in measures["accuracy"]} == {(0, 12), (5, 12)}


def test_fewer_shuffled_label_prompts_than_asked_are_noted(toy, files):
    # 14 pairs: 10 clean prompts leave 4 queries for the shuffled-label prompts.
    result = _icl(
        toy,
        text=files["texts"],
        tasks=files["t14"],
        shots="0",
        fv_prompts=10,
        fv_shots=3,
        k=2,
        draws=1,
        min_accuracy=0.0,
    )
    assert any("fourteen: 4 shuffled-label prompts, not fv_prompts=10" in note for note in result.notes), (
        result.notes
    )


def test_a_folder_as_text_is_refused_naming_text(toy, files):
    with pytest.raises(InputError, match=r"text='.*icl-edges.*': a folder, not a text file"):
        icl.read_texts(files["dir"])


def test_texts_too_short_for_the_score_are_refused_before_the_forward_passes(toy, files, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("forward pass")

    monkeypatch.setattr(icl, "text_losses", refuse)
    with pytest.raises(InputError, match=r"the texts allow tokens 1\.\.1: too short"):
        _icl(toy, text=files["one"], tasks="none")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(context=8), r"context=8 leaves no late token to compare with early=10 over window=3"),
        (dict(context=200), r"context=200 does not fit the model's context of 128 tokens"),
    ],
)
def test_contexts_that_cannot_give_a_score_are_refused(toy, files, no_forward_pass, options, message):
    with pytest.raises(InputError, match=message):
        _icl(toy, text=files["texts"], tasks="none", **options)


def test_icl_tasks_and_ordinal_sets_share_one_yaml_line_loader(files, tmp_path, monkeypatch):
    from headscope.data import icl as icl_data
    from headscope.data import ordinal, yamlines

    loaded = yamlines.parse("name: x\npairs:\n  - [a, b]\n  - [c, d]\n", "t.yaml", "see t")
    assert yamlines.key_line(loaded, "pairs") == 2 and loaded["pairs"].lines == [3, 4]
    assert yamlines.fields(loaded) == {"name": "x", "pairs": [["a", "b"], ["c", "d"]]}
    for module in (icl_data, ordinal):  # no copy of the loader is left in either module
        assert not [name for name in vars(module) if name.endswith("Loader") or name == "_LinedList"]
    seen = []
    real = yamlines.parse
    monkeypatch.setattr(yamlines, "parse", lambda *a: seen.append(a[1]) or real(*a))
    icl_data.load_task(files["t12"])
    sets = tmp_path / "ordinal.yaml"
    sets.write_text("name: o\ntasks:\n  - name: n\n    members: [t1, t2, t3]\n", encoding="utf-8")
    ordinal.load_ordinal(sets)
    assert [s.rsplit("/", 1)[-1] for s in seen] == ["t12.yaml", "ordinal.yaml"]
    with pytest.raises(hs.HeadscopeError, match=r"ordinal.yaml:3: malformed YAML.*configs/ordinal/en.yaml"):
        sets.write_text("name: o\ntasks: [\n", encoding="utf-8")
        ordinal.load_ordinal(sets)


def test_kv_plan_names_apply_context_when_its_text_is_too_short(tmp_path, monkeypatch):
    """--context 64 --apply-context 120 on a text of about 100 tokens: the refusal names the option
    that asked for 120 tokens, and comes before the scoring passes."""
    from conftest import kv_toy_module

    from headscope.analyses import kvplan

    kv = kv_toy_module()
    toy = kv.build_kv_toy()
    needles = kv.write_needles(tmp_path / "needles.yaml")
    haystack = tmp_path / "haystack.txt"
    haystack.write_text("\n".join(kv.haystack_lines(400)) + "\n", encoding="utf-8")
    short = tmp_path / "short.txt"
    short.write_text("\n".join(kv.haystack_lines(400)[:12]) + "\n", encoding="utf-8")

    def refuse(*_args, **_kwargs):
        raise AssertionError("kv-plan scored before refusing")

    monkeypatch.setattr(kvplan, "score", refuse)
    options = dict(sink=4, recent=12, depths="0.5", needles=0, resamples=0, data=str(needles))
    with pytest.raises(InputError) as found:
        hs.kv_plan(
            toy.model,
            toy.tokenizer,
            context="64",
            apply_context="120",
            text=str(short),
            haystack=str(haystack),
            **options,
        )
    assert "shorter than --apply-context 120 tokens" in str(found.value)
    assert "--context 120" not in str(found.value)


@pytest.mark.parametrize(("layer", "said"), [(1.5, "--layer 1.5"), (True, "--layer True")])
def test_show_refuses_a_layer_that_is_not_a_whole_number(toy, layer, said):
    # 1.5 passed the range check and matched no layer: an all-zero map; True showed layer 1.
    with pytest.raises(InputError, match=f"{said}: expected a whole number"):
        hs.show(toy.model, toy.tokenizer, text="t1 t2 t3", layer=layer)
    assert hs.show(toy.model, toy.tokenizer, text="t1 t2 t3", layer=1).weights.sum() > 0


def test_a_late_token_too_close_to_the_early_one_is_named(files):
    # tokens 10 and 20 over ±5 share their windows: icl_score would refuse after the passes
    with pytest.raises(
        InputError, match=r"late=20 leaves no late token to compare with early=10 over window=5"
    ):
        hs.plan("icl", text=files["texts"], tasks="none", early=10, late=20, window=5)


@pytest.mark.parametrize("value", ["", " ", ",", " , "])
def test_tasks_naming_no_task_is_refused(value):
    """tasks="" used to mean no tasks (as "none" does): the few-shot part left out unasked."""
    import headscope as hs

    with pytest.raises(InputError, match=r"^tasks='.*' names no task"):
        hs.plan("icl", tasks=value)
    assert hs.plan("icl", tasks="none") is not None

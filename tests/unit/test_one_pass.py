"""One pass spec: only headscope.capture.hooks installs hooks, and every edit leaves the model as it was.

* No module of src/headscope but ``capture/hooks.py`` calls ``register_forward_hook`` or its
  relatives (read with ast, so a comment or a docstring does not count).
* Each kind of edit (ablate heads, stream KV heads, patch heads' outputs, add a vector after a
  block) is undone when the pass raises in the middle: no hook is left on any module, and the model
  gives the same logits as before.
* The edits change what they declare: ``edits=[AblateHeads]`` ablates (the old ``ablation=`` keyword is gone), a patched
  head's output is the given vector, an added vector reaches the residual stream.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from headscope import capture
from headscope.capture import AblateHeads, AddVector, PatchHeads, StreamHeads
from headscope.errors import InputError, RunFailure
from headscope.models import anatomy

SRC = Path(__file__).resolve().parents[2] / "src" / "headscope"
HOOK_MODULE = SRC / "capture" / "hooks.py"
REGISTERS = {
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
}
HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def _hook_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in REGISTERS or name.startswith("register_module_forward"):
            found.append(f"{path.relative_to(SRC.parent)}:{node.lineno} {name}")
    return found


def test_only_capture_hooks_installs_hooks():
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 50 and HOOK_MODULE in modules
    outside = [call for path in modules if path != HOOK_MODULE for call in _hook_calls(path)]
    assert outside == [], "install hooks through headscope.capture.hooks.hooked(), not directly"
    inside = _hook_calls(HOOK_MODULE)
    assert len(inside) == 2  # the checker sees calls: it would see one anywhere else


def _hooks_on(model: torch.nn.Module) -> int:
    """Hooks on ``model`` beyond the ones it came with: the shared toy is headscope's own model, which
    keeps what transformers installs on its first ``output_attentions`` pass (an earlier test's)."""
    return _all_hooks(model) - BASELINE.get(id(model), 0)


BASELINE: dict[int, int] = {}


def _all_hooks(model: torch.nn.Module) -> int:
    return sum(len(getattr(m, name)) for m in model.modules() for name in HOOK_DICTS if hasattr(m, name))


@pytest.fixture(autouse=True)
def _baseline(request):
    """Each test counts the hooks it finds at its start as the model's own."""
    for name in ("toy", "toy_eager"):
        if name in request.fixturenames:
            model = request.getfixturevalue(name).model
            BASELINE[id(model)] = _all_hooks(model)
    yield
    BASELINE.clear()


def _batch(loaded, lengths=(9, 6)):
    generator = torch.Generator().manual_seed(3)
    vocab = loaded.model.get_input_embeddings().num_embeddings
    rows = [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]
    return capture.make_batches(
        rows, [[False] * n for n in lengths], batch_size=len(rows), pad_id=0, is_causal=True
    )[0]


def _logits(loaded, batch) -> torch.Tensor:
    with torch.inference_mode():
        out = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long())
    return out.logits.float()


def _edits(loaded) -> dict[str, object]:
    head_dim = loaded.layout.head_dim
    d_model = loaded.layout.d_model
    return {
        "ablate": AblateHeads.of([(0, 1), (1, 2)]),
        "stream": StreamHeads.of([(1, 0)], sink=1, recent=2),
        "patch": PatchHeads(0, {1: torch.full((head_dim,), 3.0)}, rows=(0,), position=-1),
        "add": AddVector(0, torch.ones(d_model), lambda b: b.attention_mask.long().sum(1) - 1),
    }


class _Boom(Exception):
    pass


@pytest.mark.parametrize("kind", ["ablate", "stream", "patch", "add"])
def test_an_edit_raising_mid_pass_leaves_no_hook_and_the_same_logits(toy, kind):
    batch = _batch(toy)
    assert _hooks_on(toy.model) == 0
    before = _logits(toy, batch)
    last = max(capture.dla.attention_layers(toy))

    def on_layer_done(layer, _batch):
        assert _hooks_on(toy.model) > 0 or kind in {"ablate", "stream"}  # the hooks are on now
        if layer == last:
            raise _Boom

    with pytest.raises(_Boom):
        spec = capture.Pass(reads=[capture.Attention(on_layer_done=on_layer_done)], edits=[_edits(toy)[kind]])
        capture.run(toy, [batch], spec)
    assert _hooks_on(toy.model) == 0
    assert torch.equal(_logits(toy, batch), before)


def test_applied_removes_its_hooks_when_the_forward_raises(toy):
    batch = _batch(toy)
    edits = _edits(toy)
    block = anatomy.blocks(toy.model)[1]

    def boom(*_):
        raise _Boom

    with (
        pytest.raises(_Boom),
        capture.applied(toy, [edits["patch"], edits["add"]]) as live,
        capture.hooks.hooked() as hooks,
    ):
        live.batch = batch
        hooks.before(block, boom)
        assert _hooks_on(toy.model) == 3
        _logits(toy, batch)
    assert _hooks_on(toy.model) == 0


def _losses(loaded, batch, **kwargs) -> torch.Tensor:
    out = []
    losses = capture.TokenLosses(lambda loss, _b: out.append(loss.clone()))
    capture.run(loaded, [batch], capture.Pass(reads=[losses], **kwargs))
    return out[0]


def test_edits_change_the_pass_and_are_the_only_spelling(toy):
    batch = _batch(toy)
    edits = _edits(toy)
    clean = _losses(toy, batch)
    for kind in ("ablate", "stream"):
        assert not torch.equal(_losses(toy, batch, edits=[edits[kind]]), clean)  # the edit changes the pass
    ablated = _losses(toy, batch, edits=[edits["ablate"], None])  # None entries are skipped
    assert torch.equal(ablated, _losses(toy, batch, edits=[edits["ablate"]]))
    for old in ("ablation", "streaming", "edits"):  # the old keywords are gone: one way to intervene
        with pytest.raises(TypeError):
            capture.run(toy, [batch], capture.Pass(), **{old: [edits["ablate"]]})


def test_a_patched_head_outputs_the_given_vector_in_its_rows_only(toy):
    batch = _batch(toy)
    module = capture.dla.HeadWrites(toy, lambda b: b.attention_mask.long().sum(1) - 1).outputs[0]
    head_dim = toy.layout.head_dim
    seen = {}
    edit = PatchHeads(0, {1: torch.full((head_dim,), 3.0)}, rows=(0,), position=-1)
    with capture.applied(toy, [edit]), capture.hooks.hooked() as hooks:
        hooks.before(module, lambda _m, args: seen.__setitem__("x", args[0].clone()))
        _logits(toy, batch)
    x = seen["x"]  # the output projection's input, after the patch (hooks run in order)
    assert torch.equal(x[0, -1, head_dim : 2 * head_dim], torch.full((head_dim,), 3.0))
    assert not torch.equal(x[1, -1, head_dim : 2 * head_dim], torch.full((head_dim,), 3.0))
    assert not torch.equal(x[0, -2, head_dim : 2 * head_dim], torch.full((head_dim,), 3.0))


def test_an_added_vector_moves_the_residual_at_its_position(toy):
    batch = _batch(toy)
    d_model = toy.layout.d_model
    ends = batch.attention_mask.long().sum(1) - 1
    vectors = torch.zeros(2, d_model)
    vectors[1, 0] = 5.0  # only example 1, only coordinate 0
    edit = AddVector(
        len(anatomy.blocks(toy.model)) - 1, vectors, lambda b: b.attention_mask.long().sum(1) - 1
    )
    clean, moved = [], []
    capture.run(
        toy, [batch], capture.Pass(reads=[capture.FinalHidden(lambda h, _b: clean.append(h.clone()))])
    )
    moving = capture.FinalHidden(lambda h, _b: moved.append(h.clone()))
    capture.run(toy, [batch], capture.Pass(reads=[moving], edits=[edit]))
    changed = (clean[0] != moved[0]).any(-1)  # [B, T]
    row = int((batch.example_index == 1).nonzero()[0, 0])  # batches may order rows by length
    assert changed.nonzero().tolist() == [[row, int(ends[row])]]


def _bad_edits(loaded):
    layout = loaded.layout
    width, d_model = layout.v_head_dim, layout.d_model
    every = lambda b: b.attention_mask.long().sum(1) - 1  # noqa: E731
    return [
        ([AblateHeads.of([(0, 1)]), AblateHeads.of([(0, 0)])], "one AblateHeads per pass"),
        (
            [AblateHeads.of([(0, layout.n_heads)])],
            f"AblateHeads: head {layout.n_heads} of layer 0 does not exist",
        ),
        ([AblateHeads.of([(layout.n_layers, 0)])], f"AblateHeads: layer {layout.n_layers} has no attention"),
        (
            [StreamHeads.of([(1, layout.n_kv_heads)], 1, 2)],
            f"StreamHeads: KV head {layout.n_kv_heads} of layer 1",
        ),
        ([PatchHeads(7, {0: torch.zeros(width)})], "PatchHeads: layer 7 has no attention"),
        (
            [PatchHeads(0, {0: torch.zeros(width + 1)})],
            rf"PatchHeads: head 0's value has shape \({width + 1},\)",
        ),
        (
            [PatchHeads(0, {layout.n_heads: torch.zeros(width)})],
            f"PatchHeads: head {layout.n_heads} does not exist",
        ),
        ([AddVector(7, torch.zeros(d_model), every)], "AddVector: layer 7 is not a block"),
        ([AddVector(0, torch.zeros(d_model - 1), every)], rf"AddVector: vectors of shape \({d_model - 1},\)"),
        # Layers and heads are ints, whatever the kind: a string "0" was reported as a layer the
        # model lacks ("layer 0 has no attention (the attention layers are 0..1)") or escaped as a
        # TypeError; a value that is not a tensor escaped as an AttributeError.
        ([AblateHeads({"0": (1,)})], r"AblateHeads: heads: layer '0' \(str\) is not an int"),
        ([AblateHeads({0: (True,)})], r"AblateHeads: heads: head True \(bool\) of layer 0 is not an int"),
        (
            [StreamHeads({1: ("0",)}, 1, 2)],
            r"StreamHeads: kv_heads: head '0' \(str\) of layer 1 is not an int",
        ),
        ([StreamHeads({1: 0}, 1, 2)], r"StreamHeads: kv_heads: layer 1's heads 0 \(int\) are not a tuple"),
        ([PatchHeads("0", {0: torch.zeros(width)})], r"PatchHeads: layer '0' \(str\) is not an int"),
        ([PatchHeads(0, {"0": torch.zeros(width)})], r"PatchHeads: values: head '0' \(str\) is not an int"),
        ([PatchHeads(0, {0: [0.0] * width})], r"PatchHeads: head 0's value .* \(list\) is not a tensor"),
        ([AddVector("0", torch.zeros(d_model), every)], r"AddVector: layer '0' \(str\) is not an int"),
        ([AddVector(0, [0.0] * d_model, every)], r"AddVector: vectors .* \(list\) is not a tensor"),
        ([AddVector(0, torch.zeros(d_model), 3)], r"AddVector: positions 3 \(int\) is not a function"),
    ]


def test_edits_are_checked_before_any_hook_goes_on(toy, toy_eager):
    for edits, message in _bad_edits(toy):
        with pytest.raises(InputError, match=message) as caught, capture.applied(toy, edits):
            pass
        assert caught.value.hint  # says what the model has or what to give
        assert _hooks_on(toy.model) == 0
    with pytest.raises(TypeError, match="not an edit"), capture.applied(toy, ["ablate"]):
        pass
    with (
        pytest.raises(RunFailure, match="streaming KV heads need streaming capture"),
        capture.applied(toy_eager, [_edits(toy)["stream"]]),
    ):
        pass
    assert _hooks_on(toy.model) == 0
    with (
        pytest.raises(RunFailure, match="AddVector needs the pass's batch"),
        capture.applied(toy, [_edits(toy)["add"]]),
    ):
        _logits(toy, _batch(toy))
    assert _hooks_on(toy.model) == 0


def test_a_bad_edit_is_refused_before_the_first_forward_pass(toy, monkeypatch):
    calls = []
    monkeypatch.setattr(type(toy.base), "__call__", lambda *a, **k: calls.append(1))
    for edits, message in _bad_edits(toy):
        with pytest.raises(InputError, match=message):
            capture.run(toy, [_batch(toy)], capture.Pass(edits=edits))
    assert calls == []


# --- the reads: one declared object each, checked before the first forward pass ----------------------


def _bad_passes(toy, toy_eager, bert):
    """(model, a function that declares and runs the pass, the error, its message): each names the read."""
    keep = lambda *_: None  # noqa: E731
    return [
        (
            toy,
            lambda: capture.Pass(reads=[capture.TokenLosses(keep), None, capture.TokenLosses(keep)]),
            InputError,
            "one TokenLosses read per pass, got 2",
        ),
        (
            toy,
            lambda: capture.Pass(reads=[capture.Attention(keep), capture.Attention(keep, rows=None)]),
            InputError,
            "one Attention read per pass, got 2",
        ),
        (
            toy_eager,
            lambda: capture.Pass(reads=[capture.HeadOutputMeans([(0, 1)])]),
            RunFailure,
            "HeadOutputMeans: head ablation's mean outputs need streaming capture",
        ),
        (
            toy_eager,
            lambda: capture.Pass(reads=[capture.BlockRecorder(toy, [1])]),
            RunFailure,
            "BlockRecorder: path patching's block inputs need streaming capture",
        ),
        (
            bert,
            lambda: capture.Pass(reads=[capture.TokenLosses(keep)]),
            RunFailure,
            "TokenLosses: next-token losses need a language model with an LM head",
        ),
        (
            toy,
            lambda: capture.Pass(reads=[capture.FinalHidden(keep)], stop_after=0),
            InputError,
            "FinalHidden: a pass with stop_after=0 ends early and has no final states",
        ),
        (
            toy,
            lambda: capture.Pass(reads=[capture.Attention(keep), capture.TokenLosses(keep)], stop_after=1),
            InputError,
            "TokenLosses: a pass with stop_after=1 ends early",
        ),
        (toy_eager, lambda: capture.Pass(stop_after=0), RunFailure, "stop_after=0 needs streaming capture"),
        (
            toy,
            lambda: capture.Pass(reads=[capture.Attention(rows=capture.rows.last_row)]),
            InputError,
            "Attention: rows without on_layer",
        ),
    ]


def test_a_bad_read_is_refused_before_any_forward_pass_naming_the_read(toy, toy_eager, monkeypatch):
    from tiny_models import tiny_bert

    bert = tiny_bert()
    calls = []
    for loaded in (toy, toy_eager, bert):
        monkeypatch.setattr(type(loaded.base), "__call__", lambda *a, **k: calls.append(1))
    for loaded, declare, error, message in _bad_passes(toy, toy_eager, bert):
        batch = _batch(loaded, lengths=(5, 4))
        with pytest.raises(error, match=message):
            capture.run(loaded, [batch], declare())
    assert calls == []
    with pytest.raises(TypeError, match="not a read"):
        capture.Pass(reads=[lambda *_: None])
    for old in ((lambda *_: None,), (None,)):  # the old positional on_layer: capture.run takes a Pass only
        with pytest.raises(TypeError, match="capture.run takes a Pass"):
            capture.run(toy, [_batch(toy)], *old)
    assert calls == []


def test_a_pass_reads_what_it_declares(toy):
    """One pass, four reads: attention rows, token losses, final states and heads' writes all arrive,
    the same as each alone."""
    batch = _batch(toy)
    got: dict[str, list] = {"layers": [], "losses": [], "hidden": [], "done": []}
    ends = lambda b: b.attention_mask.long().sum(1) - 1  # noqa: E731
    writes = capture.HeadWrites(toy, ends, keep={0})
    spec = capture.Pass(
        reads=[
            capture.Attention(lambda layer, *_: got["layers"].append(layer), rows=capture.rows.last_row),
            capture.TokenLosses(lambda loss, _b: got["losses"].append(loss.clone())),
            capture.FinalHidden(lambda h, _b: got["hidden"].append(h.clone())),
            writes,
        ],
        on_batch_done=lambda b: got["done"].append(writes.kept[0].clone()),
    )
    capture.run(toy, [batch], spec)
    assert sorted(set(got["layers"])) == capture.dla.attention_layers(toy)
    alone: list[torch.Tensor] = []
    capture.run(toy, [batch], capture.Pass(reads=[capture.TokenLosses(lambda loss, _b: alone.append(loss))]))
    assert torch.allclose(got["losses"][0], alone[0], atol=1e-5, rtol=0)
    assert got["hidden"][0].shape[:2] == batch.input_ids.shape
    assert got["done"][0].shape[0] == batch.input_ids.shape[0]


def test_on_layer_done_alone_is_called_for_every_layer_in_both_captures(toy, toy_eager):
    """An Attention read with only on_layer_done reads no row, yet hears each layer end (eager
    capture used to skip it when there was no on_layer)."""
    for loaded in (toy, toy_eager):
        done: list[int] = []
        read = capture.Attention(on_layer_done=lambda layer, _b, done=done: done.append(layer))
        capture.run(loaded, [_batch(loaded)], capture.Pass(reads=[read]))
        assert done == capture.dla.attention_layers(loaded), loaded.capture_mode

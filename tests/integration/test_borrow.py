"""A borrowed model comes back exactly as it was, from every analysis in the registry (plugins'
and run-time ones included), whether the analysis ends normally, is refused, fails, or is
interrupted; and two threads analysing one model object take turns.

The model is the toy, loaded by the test as a user would, then given state of its own: train mode
on one block, a forward hook of the user's, frozen and gradient-carrying parameters.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import threading

import pytest
import torch
from conftest import TOY_DIR, TOY_TEXTS

import headscope as hs
from headscope.errors import HeadscopeError
from headscope.extend.protocol import ANALYSES

# Small options per analysis, so each runs (or is refused) in seconds on the toy.
SMALL = {
    "scan": dict(resamples=0, detectors="previous-token,induction,sink", text=TOY_TEXTS),
    "induction": dict(resamples=0, n_seqs=4, seq_len=20),
    "weights": dict(resamples=0, tokens=200),
    "detect": dict(prompts=["t1 t2 t3 t4 t1 t2 t3 t4"], pattern="induction_head", resamples=0),
}


def users_hook(module, args, output):
    """The user's own forward hook (module level, so the model still pickles)."""
    return None


def user_model():
    """The toy as a user has it: some state of their own that headscope must not touch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    model.train()
    model.model.layers[0].eval()
    model.model.layers[1].mlp.requires_grad_(False)
    model.lm_head.weight.grad = torch.full_like(model.lm_head.weight, 0.5)
    model.model.layers[0].register_forward_hook(users_hook)
    return model, AutoTokenizer.from_pretrained(TOY_DIR)


def state(model) -> dict:
    return {
        "config": model.config.to_dict(),
        "attn": model.config._attn_implementation,
        "training": [m.training for m in model.modules()],
        "hooks": [
            (name, len(m._forward_hooks), len(m._forward_pre_hooks), len(m._forward_hooks_with_kwargs))
            for name, m in model.named_modules()
        ],
        "flags": [
            name for name, m in model.named_modules() if "_output_capturing_hooks_installed" in vars(m)
        ],
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
    }


def assert_same(before: dict, model) -> None:
    after = state(model)
    for key in ("config", "attn", "training", "hooks", "flags", "requires_grad"):
        assert after[key] == before[key], key
    for name, tensor in before["weights"].items():
        assert torch.equal(after["weights"][name], tensor), name
    for was, now in zip(before["grads"], after["grads"], strict=True):
        assert (was is None and now is None) or torch.equal(was, now)
    torch.save(model, io.BytesIO())
    pickle.dumps(model)
    copy.deepcopy(model)


@pytest.mark.parametrize("name", list(ANALYSES))
def test_every_analysis_gives_the_model_back_as_it_was(name):
    model, tokenizer = user_model()
    before = state(model)
    # A refusal (the toy has no needle or IOI vocabulary) must give the model back too.
    with contextlib.suppress(HeadscopeError):
        hs.run(name, model, tokenizer, **SMALL.get(name, {}))
    assert_same(before, model)


def test_an_interrupted_analysis_gives_the_model_back():
    model, tokenizer = user_model()
    before = state(model)

    def interrupt(label, total):
        def advance(n):
            raise KeyboardInterrupt

        return advance

    with pytest.raises(KeyboardInterrupt):
        hs.induction(model, tokenizer, resamples=0, progress=interrupt)
    assert_same(before, model)


def test_two_threads_on_one_model_take_turns_and_get_what_one_run_gets():
    model, tokenizer = user_model()
    before = state(model)
    alone = hs.induction(model, tokenizer, resamples=0, n_seqs=4, seq_len=20).table
    results, errors = [None, None], []

    def work(slot):
        try:
            results[slot] = hs.induction(model, tokenizer, resamples=0, n_seqs=4, seq_len=20).table
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for table in results:
        assert table.score.tolist() == alone.score.tolist()
    assert_same(before, model)
    # Nothing the threads did was recorded as a verdict on the model: a later run still works.
    assert len(hs.induction(model, tokenizer, resamples=0, n_seqs=2, seq_len=10).table)

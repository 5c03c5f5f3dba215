"""What the weight-only scores cost, measured side by side in one process.

For each model: the whole ``weights`` analysis (default 2,000 tokens, k = 5, mlp0), then, on a few
heads, headscope's exact rank tests with early stopping against the dense way (every sampled row's
logits over the whole vocabulary, then counting), with the answers checked equal. Also a bare
forward pass over the same number of tokens, as the everyday unit of cost.

    python benchmarks/bench_weights.py --models smollm2-135m,gemma3-270m --json weights.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from headscope.analyses.weights import weights
from headscope.models import load
from headscope.weightroles.ov import Candidates, Circuits, ordinary_ids, rank_tests


def dense(values, w_o, unembed, own, candidates, k):  # noqa: ANN001, ANN201
    logits = (values @ w_o) @ unembed[candidates].T  # [N, C]
    own_logit = logits.gather(1, (candidates[None, :] == own[:, None]).float().argmax(1, keepdim=True))
    mask = candidates[None, :] == own[:, None]
    above = ((logits >= own_logit) & ~mask).sum(1)
    below = ((logits <= own_logit) & ~mask).sum(1)
    return above < k, below < k


def bench(name: str, tokens: int, heads: int) -> dict:
    loaded = load(name)
    start = time.perf_counter()
    report = weights(loaded, tokens=tokens)
    total = time.perf_counter() - start

    circuits = Circuits(loaded)
    candidates = ordinary_ids(loaded)
    generator = torch.Generator().manual_seed(0)
    sample = candidates[torch.randperm(len(candidates), generator=generator)[:tokens]]
    rivals = Candidates.of(candidates, circuits.unembed, generator)
    raw, effective = circuits.embeddings(sample, "mlp0")
    layout = loaded.layout
    # The strongest copying heads (the slow case for early stopping) and as many ordinary ones.
    table = report.table
    copying = table[table.relation == "copying"].sort_values("score", ascending=False)
    chosen = list(zip(copying.layer, copying["head"], strict=True))
    picked = chosen[: heads // 2] + chosen[len(chosen) // 2 : len(chosen) // 2 + heads - heads // 2]
    fast = slow = 0.0
    for layer_index, head in picked:
        layer = circuits.layer(int(layer_index))
        inputs = circuits.layer_inputs(layer, int(layer_index), raw, effective)
        values = inputs @ layer.w_v[int(head) // layout.group_size]
        w_o = layer.w_o[int(head)]
        t = time.perf_counter()
        got = rank_tests(values, w_o, circuits.unembed[sample], sample, rivals, 5)
        fast += time.perf_counter() - t
        t = time.perf_counter()
        want = dense(values, w_o, circuits.unembed, sample, candidates, 5)
        slow += time.perf_counter() - t
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (layer_index, head)

    ids = sample[None, : min(tokens, 512)].repeat(max(1, tokens // 512), 1)
    t = time.perf_counter()
    with torch.inference_mode():
        loaded.base(input_ids=ids)
    bare = time.perf_counter() - t
    return {
        "model": name,
        "tokens": tokens,
        "candidates": len(candidates),
        "heads": layout.n_layers * layout.n_heads,
        "weights_seconds": round(total, 1),
        "checked_heads": len(picked),
        "early_stop_seconds": round(fast, 2),
        "dense_seconds": round(slow, 2),
        "dense_over_early_stop": round(slow / fast, 1),
        "bare_forward_seconds": round(bare, 2),
        "weights_over_bare_forward": round(total / bare, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--heads", type=int, default=4, help="heads checked against the dense way")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = [bench(name, args.tokens, args.heads) for name in args.models.split(",")]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()

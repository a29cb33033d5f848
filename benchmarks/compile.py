"""Training step, eager against ``torch.compile`` (inductor): Swin classifiers, the same weights on both sides.

What ``--model.compile true`` does: the model compiled in place (``nn.Module.compile``), then forward,
cross-entropy, backward and an AdamW step. The first compiled step (tracing and code generation) is
printed apart and left out of the rounds.
"""

from __future__ import annotations

import copy
import time

import torch

from benchmarks.timing import Row, compare
from benchmarks.timing import classifier_training_step as training_step
from vision_tx.backbones import build_classifier

# name, classifier kwargs, batch, image side
CASES = (
    (
        "small swin (the former classification_toy backbone)",
        dict(embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), window_size=4),
        32,
        64,
    ),
    ("swin_t classifier", {}, 8, 224),
)


def run(device: str, quick: bool) -> list[Row]:
    rows = []
    for name, kwargs, batch, side in CASES:
        torch.manual_seed(0)
        eager = build_classifier("swin_t", 1000, **kwargs).train().to(device)
        compiled = copy.deepcopy(eager)
        compiled.compile()
        images = torch.randn(batch, 3, side, side, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)
        eager_optimizer, compiled_optimizer = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (eager, compiled))
        start = time.perf_counter()
        training_step(compiled, compiled_optimizer, images, labels)
        print(
            f"{name}, batch {batch}, {side}x{side}: first compiled training step (compilation) "
            f"{time.perf_counter() - start:.1f} s",
            flush=True,
        )
        rows.append(
            compare(
                f"{name} training step, {batch}x{side}x{side}, inductor",
                lambda: training_step(compiled, compiled_optimizer, images, labels),
                lambda: training_step(eager, eager_optimizer, images, labels),
                "eager",
                device=device,
                unit_items=batch,
                warmup=1,
                iters=2 if quick else 6,
            )
        )
    return rows

"""scripts/compare_common.py's TrainingClock counts training time without the validations and stops at its budget."""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
STEP_SECONDS, VALIDATION_SECONDS, BUDGET = 0.05, 0.3, 1.0


class Sleepy(pl.LightningModule):
    """A linear classifier whose steps take ``STEP_SECONDS`` and validations ``VALIDATION_SECONDS``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.validations = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(STEP_SECONDS)
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        time.sleep(VALIDATION_SECONDS)
        self.validations += not self.trainer.sanity_checking

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_clock_leaves_validations_out_and_stops_the_run_at_its_budget() -> None:
    script = runpy.run_path(str(SCRIPTS / "compare_common.py"))
    clock = script["TrainingClock"](budget_seconds=BUDGET)
    data = TensorDataset(torch.randn(400, 4), torch.randint(0, 2, (400,)))
    model = Sleepy()
    trainer = pl.Trainer(max_steps=100, val_check_interval=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
    start = time.perf_counter()
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    total = time.perf_counter() - start
    summary = clock.summary()
    assert model.validations >= 1 and summary["steps"] < 100  # stopped by the budget, not by max_steps
    assert BUDGET <= summary["train_seconds"] <= total - model.validations * VALIDATION_SECONDS
    assert summary["train_seconds"] >= summary["steps"] * STEP_SECONDS
    assert summary["images_seen"] == 4 * summary["steps"] and summary["torch_threads"] == [torch.get_num_threads()]
    assert 2 <= summary["validated_step"] <= summary["steps"]


def test_options_after_the_double_dash_go_to_vision_tx() -> None:
    common = runpy.run_path(str(SCRIPTS / "compare_common.py"))
    parser = common["comparison_parser"]("doc", "a set", "dino_swin_toy", "runs/x")
    args, extra = common["parse_with_vision_tx_options"](parser, ["/data", "--seed", "1", "--", "--model.lr", "2e-4"])
    assert (args.root, args.seed, args.config, extra) == (Path("/data"), 1, "dino_swin_toy", ["--model.lr", "2e-4"])
    args, extra = common["parse_with_vision_tx_options"](parser, ["/data"])
    assert (args.seed, args.budget_seconds, extra) == (0, None, [])

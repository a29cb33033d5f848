"""Mask2Former against UperNet (semantic) and DETR panoptic at equal training steps on the built-in toy sets,
and Mask2Former's instance mask AP: each run fits a config of ``vision_tx/configs/`` for ``--steps`` optimiser
steps, validates once at the end and prints one JSON line (steps, seconds in all and in training alone, metrics).

    python scripts/compare_mask2former_toy.py --run m2f_semantic --steps 1500 --accelerator gpu

Runs: m2f_semantic, upernet_semantic (the same backbone and optimiser, UperNet head), m2f_panoptic,
detr_panoptic, m2f_instance. Configs are read with PyYAML and built from their ``class_path``s, so the
script needs no command-line parser.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import time
from pathlib import Path

import lightning.pytorch as pl

from vision_tx.config_loader import load_config
from vision_tx.lightning.budget import TrainingBudget

CONFIGS = Path(__file__).resolve().parents[1] / "vision_tx" / "configs"
RUNS = {
    "m2f_semantic": ("mask2former_swin_toy_ade20k", {}, "val/mIoU"),
    "upernet_semantic": (
        "mask2former_swin_toy_ade20k",
        {"head": "upernet", "head_kwargs": {"channels": 128, "aux_channels": 64}, "criterion_kwargs": None},
        "val/mIoU",
    ),
    "m2f_panoptic": ("mask2former_swin_toy_coco_panoptic", {}, "val/PQ"),
    "detr_panoptic": ("detr_panoptic_swin_toy", {}, "val/PQ"),
    "m2f_instance": ("mask2former_swin_toy_coco_instance", {}, "val/segm_AP50"),
}


def build(node):
    """A config node with its ``class_path`` objects built."""
    if isinstance(node, dict) and "class_path" in node:
        module, _, name = node["class_path"].rpartition(".")
        return getattr(importlib.import_module(module), name)(
            **{k: build(v) for k, v in node.get("init_args", {}).items()}
        )
    if isinstance(node, dict):
        return {k: build(v) for k, v in node.items()}
    if isinstance(node, list):
        return [build(v) for v in node]
    return node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", choices=sorted(RUNS), required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--out", default="runs/compare_mask2former_toy")
    args = parser.parse_args()
    name, overrides, metric = RUNS[args.run]
    config = load_config(CONFIGS / f"{name}.yaml")
    pl.seed_everything(config.get("seed_everything", 0))
    model_node = copy.deepcopy(config["model"])
    model_node["init_args"].update(overrides)
    module, datamodule = build(model_node), build(config["data"])
    clip = None if args.run == "upernet_semantic" else config["trainer"].get("gradient_clip_val")
    clock = TrainingBudget()
    trainer = pl.Trainer(
        max_steps=args.steps,
        val_check_interval=args.steps,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        accelerator=args.accelerator,
        devices=1,
        gradient_clip_val=clip,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(Path(args.out) / args.run),
        log_every_n_steps=50,
        callbacks=[clock],
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    seconds = time.perf_counter() - start
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    print(
        json.dumps(
            {
                "run": args.run,
                "config": name,
                "steps": args.steps,
                "seconds": round(seconds, 1),
                "train_seconds": round(clock.spent, 1),
                "metric": metric,
                "value": metrics.get(metric),
                "val": metrics,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

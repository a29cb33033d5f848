"""Training and validation on 2 DDP processes (CPU, gloo) agree with 1 process, through the command line.

Gradients and weights agree up to the order of float additions: DDP sums the processes' gradients
in an all-reduce where one process sums the batch's inside autograd. What makes them agree at all:
- the same global batches: ``EpochSampler`` gives process ``r`` the ``r``-th block of each global
  batch, and each image's augmentation is seeded by (seed, epoch, index), not by the process;
- DETR divides its box losses by the boxes of the whole global batch (all-reduced), whatever the
  number of processes. Its class loss is a weighted mean per process (as in the reference code):
  equal to the global one only when the no-object weight ``eos_coef`` is 1, which the test sets;
- UperNet's BatchNorm sees the same images per forward when one process accumulates the gradients
  of ``world_size`` micro-batches (torch's SyncBatchNorm, used on GPUs, needs CUDA);
- no dropout: processes seeded alike draw the same masks, one process draws one per image.
AdamW turns a gradient near its ``eps`` (1e-8) into a step of any size between 0 and the learning
rate, so float-order noise of 1e-8 in such gradients can move weights by up to the learning rate:
weights are compared after a few small steps, gradients at any learning rate.
Validation metrics are exactly equal: every image is scored once, whatever the number of processes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import torch

from tests.lightning.test_detection import SMALL
from tests.lightning.test_resume import SEGMENTATION, train
from tests.lightning.tools import ROOT, run_tool, run_tool_in_process
from vision_tx.data.toy import make_toy_coco
from vision_tx.data.toy_panoptic import make_toy_coco_panoptic
from vision_tx.data.toy_segmentation import make_toy_segmentation

QUIET = [
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.num_sanity_val_steps",
    "0",
]


class SaveFirstGradients(pl.Callback):
    """Saves the (all-reduced) gradients of the first optimiser step to ``path``, from the first process."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        if trainer.global_step == 0 and trainer.is_global_zero:
            torch.save({n: p.grad for n, p in pl_module.named_parameters() if p.grad is not None}, self.path)


def train_on(args: list[str], run_dir: Path, devices: int) -> tuple[dict, dict]:
    """Trains on ``devices`` processes (``ddp`` strategy when more than one; one: this process); returns
    the final checkpoint and the first step's gradients."""
    run_dir.mkdir()
    callbacks = (
        "[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
        "init_args: {monitor: null, mode: min, save_last: true, save_top_k: 0}}, "
        f"{{class_path: tests.lightning.test_ddp.SaveFirstGradients, init_args: {{path: {run_dir / 'gradients.pt'}}}}}]"
    )
    strategy = ["--trainer.devices", str(devices), "--trainer.strategy", "ddp" if devices > 1 else "auto"]
    args = [*args, *QUIET, *strategy, "--trainer.callbacks", callbacks]
    if devices == 1:
        run_tool_in_process("train.py", *args, "--trainer.default_root_dir", str(run_dir), cwd=run_dir)
    else:
        result = train(args, run_dir)
        assert result.returncode == 0, result.stderr[-5000:]
    checkpoint = torch.load(next(run_dir.rglob("last.ckpt")), map_location="cpu", weights_only=True)
    return checkpoint, torch.load(run_dir / "gradients.pt", weights_only=True)


def assert_close_tensors(one: dict[str, torch.Tensor], two: dict[str, torch.Tensor], names: list[str]) -> None:
    assert names
    for name in names:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6, msg=name)


def assert_detr_trains_the_same(args: list[str], run_dir: Path, steps: int) -> dict[str, torch.Tensor]:
    """Trains a DETR config (64x64 toy images) ``steps`` steps on 1 process with batch 2 and on 2 with
    batch 1; asserts equal gradients and weights, returns the first step's gradients."""
    args = [
        *args,
        "--model.criterion_kwargs",
        "{eos_coef: 1.0}",
        # Square images and size-keeping augmentations (random flips, whole-image crops): no batch
        # padding, which would otherwise differ between a batch of 2 and two batches of 1.
        "--data.train_transform.init_args.scales",
        "[64]",
        "--data.train_transform.init_args.max_size",
        "64",
        "--data.train_transform.init_args.crop_scales",
        "[64]",
        "--data.train_transform.init_args.crop_size",
        "[64, 64]",
        "--trainer.max_steps",
        str(steps),
        "--trainer.limit_val_batches",
        "0",
    ]
    one, one_gradients = train_on([*args, "--data.batch_size", "2"], run_dir / "one", devices=1)
    two, two_gradients = train_on([*args, "--data.batch_size", "1"], run_dir / "two", devices=2)
    assert one["global_step"] == two["global_step"] == steps
    assert_close_tensors(one_gradients, two_gradients, list(one_gradients))
    assert_close_tensors(one["state_dict"], two["state_dict"], list(one["state_dict"]))
    return one_gradients


# No dropout below: processes seeded alike draw the same masks, one process draws one per image.
def test_detection_trains_the_same_on_two_processes(tmp_path: Path) -> None:
    root = make_toy_coco(tmp_path / "toy", num_train=12, num_val=3, min_side=64, max_side=64)
    detr = (
        "{num_queries: 5, hidden_dim: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 1, "
        "dim_feedforward: 64, dropout: 0.0}"
    )
    assert_detr_trains_the_same([*SMALL, "--data.root", str(root), "--model.detector_kwargs", detr], tmp_path, steps=3)


def test_panoptic_trains_the_same_on_two_processes(tmp_path: Path) -> None:
    root = make_toy_coco_panoptic(tmp_path / "toy", num_train=8, num_val=2, min_side=64, max_side=64)
    args = [
        "--config",
        "detr_panoptic_swin_toy",
        "--data.root",
        str(root),
        "--data.num_workers",
        "0",
        "--trainer.accelerator",
        "cpu",
        "--model.backbone_kwargs",
        "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], drop_path_rate: 0.0}",
        "--model.detector_kwargs",
        "{num_queries: 5, hidden_dim: 128, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 1, "
        "dim_feedforward: 64, dropout: 0.0}",
    ]
    gradients = assert_detr_trains_the_same(args, tmp_path, steps=2)
    assert any(name.startswith("model.mask_head.") for name in gradients)  # the mask losses reach the head


def test_segmentation_trains_and_validates_the_same_on_two_processes(tmp_path: Path) -> None:
    root = make_toy_segmentation(
        tmp_path / "toy", num_train=12, num_val=5
    )  # 5 validation images: 3 + 2 on two processes
    args = [
        # A high learning rate, so that the validated model predicts something after 3 steps.
        *SEGMENTATION,
        "--data.root",
        str(root),
        "--model.head_kwargs",
        "{channels: 16, aux_channels: 8, dropout: 0.0}",
        "--model.lr",
        "1e-2",
        "--model.warmup_iters",
        "0",
        "--model.backbone_kwargs",
        "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], drop_path_rate: 0.0}",
        "--trainer.max_steps",
        "3",
    ]
    # One process validates at the end of its epoch (6 batches of 2, accumulated by 2: 3 steps).
    one, one_gradients = train_on([*args, "--trainer.accumulate_grad_batches", "2"], tmp_path / "one", devices=1)
    two, two_gradients = train_on([*args, "--trainer.limit_val_batches", "0"], tmp_path / "two", devices=2)
    assert one["global_step"] == two["global_step"] == 3
    assert_close_tensors(one_gradients, two_gradients, list(one_gradients))

    # Two processes validate the one-process model: 3 + 2 images, none repeated.
    out = tmp_path / "validate"
    out.mkdir()
    run_tool(
        "eval.py",
        *SEGMENTATION,
        *QUIET,
        "--data.root",
        str(root),
        "--ckpt",
        str(next((tmp_path / "one").rglob("last.ckpt"))),
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.logger",
        "true",
        "--trainer.default_root_dir",
        str(out),
        cwd=out,
    )
    one_metrics, two_metrics = (
        json.loads(next(d.rglob("metrics.json")).read_text())["segm_sem"] for d in (tmp_path / "one", out)
    )
    assert one_metrics == two_metrics
    assert one_metrics["aAcc"] > 0  # the model gets some pixels right: the counts of every image matter


def node_environment(node_rank: int, nodes: int, port: int) -> dict[str, str]:
    """What ``torchrun --nnodes NODES --nproc_per_node 1 --node_rank NODE_RANK`` gives its one process."""
    return {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nodes),
        "RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_two_nodes_validate_like_one_process(
    detr_checkpoint: Path, detr_toy_cache: Path, metrics_on_one_process: Callable[[str], dict], tmp_path: Path
) -> None:
    """The README's several-machine command on localhost: 2 nodes of 1 process, started as torchrun starts
    them (``--trainer.num_nodes 2``, gloo on CPU), give the metrics of 1 process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        str(ROOT / "tools" / "eval.py"),
        *SMALL,
        "--data.batch_size",
        "1",
        "--ckpt",
        str(detr_checkpoint),
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--trainer.num_nodes",
        "2",
        "--trainer.devices",
        "1",
        "--trainer.strategy",
        "ddp",
        "--trainer.logger",
        "true",
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    nodes = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=node_environment(rank, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]  # the second node's process joined as rank 1 of 2
    assert not any("sync_dist=True" in output for output in outputs)  # the metrics are global: no advice to sync them
    assert json.loads(next(tmp_path.rglob("metrics.json")).read_text()) == metrics_on_one_process("detr")


def test_sam_classification_trains_the_same_on_two_processes(tmp_path: Path) -> None:
    """SAM under DDP ascends along the all-reduced gradient: 2 processes of batch 2 give the gradients
    of the second pass (at ``w + e``) and the weights after 2 steps of 1 process of batch 4. Images are
    64x64 so that stage 4 has 2x2 tokens: with one token per window its attention's query, key and bias
    table have no gradient but rounding noise, which AdamW's first steps blow up to the learning rate."""
    from vision_tx.data.toy_classification import make_toy_classification

    root = make_toy_classification(tmp_path / "toy", num_train_per_class=2, num_val_per_class=1, side=64)
    args = [
        "--config",
        "classification_toy",
        "--data.root",
        str(root),
        "--data.num_workers",
        "0",
        "--data.image_size",
        "64",
        "--trainer.accelerator",
        "cpu",
        "--trainer.max_steps",
        "2",
        "--trainer.limit_val_batches",
        "0",
        "--model.backbone",
        "swin_t",
        "--model.backbone_kwargs",
        "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], window_size: 4, drop_path_rate: 0.0}",
        "--model.mixup_alpha",
        "0",
        "--model.cutmix_alpha",
        "0",
        "--model.warmup_epochs",
        "0",
        "--data.repeats",
        "1",
        "--trainer.callbacks+=vision_tx.lightning.callbacks.SharpnessAwareMinimization",
        "--trainer.callbacks.rho",
        "0.5",
    ]
    one, one_gradients = train_on([*args, "--data.batch_size", "4"], tmp_path / "one", devices=1)
    two, two_gradients = train_on([*args, "--data.batch_size", "2"], tmp_path / "two", devices=2)
    assert one["global_step"] == two["global_step"] == 2
    assert_close_tensors(one_gradients, two_gradients, list(one_gradients))
    # The weights: every one to float order, except the attention's key biases, which get no gradient (the
    # softmax ignores a constant per query): AdamW turns their rounding noise (1e-11, of either sign on 1
    # and 2 processes) into moves of up to lr * g / eps, 1.3e-6 measured, far below the lr of 2.5e-4.
    weights = [dict(checkpoint["state_dict"]) for checkpoint in (one, two)]
    for name in [name for name in weights[0] if name.endswith("attn.qkv.bias")]:
        (q1, k1, v1), (q2, k2, v2) = (state[name].chunk(3) for state in weights)
        torch.testing.assert_close(k2, k1, rtol=0, atol=1e-5, msg=name)
        weights[0][name], weights[1][name] = torch.cat([q1, v1]), torch.cat([q2, v2])  # to float order below
    # Likewise any entry whose first gradient is near rounding noise on either side (below 10 AdamW eps, 1e-7: a unit of
    # a 16-wide network that these 4 images leave dead, summed in another order on 2 processes by the CPU's
    # oneDNN kernels): AdamW moves it by up to the learning rate a step, in the noise's direction.
    for name, gradient in one_gradients.items():
        if name in weights[0] and not name.endswith("attn.qkv.bias"):
            noise = (gradient.abs() < 1e-7) | (two_gradients[name].abs() < 1e-7)
            moved = (weights[1][name] - weights[0][name])[noise].abs()
            assert moved.numel() == 0 or float(moved.max()) <= 2 * 2.5e-4 * 1.01, name
            weights[1][name] = torch.where(noise, weights[0][name], weights[1][name])
    assert_close_tensors(*weights, list(weights[0]))

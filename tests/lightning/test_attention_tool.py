"""tools/attention.py from a config and a checkpoint: the pictures of a trained DeiT classifier (input,
rollout, one map per head) and of a trained DETR detector (input, one picture per object)."""

from __future__ import annotations

from pathlib import Path

from torchvision.io import read_image

from tests.lightning.test_detection import SMALL as DETR_SMALL
from tests.lightning.tools import run_tool_in_process
from vision_tx.data.toy_classification import make_toy_classification

SIDE = 32
DEIT = [
    "--config",
    "deit_small_imagenet",
    "--model.backbone_kwargs",
    f"{{embed_dim: 16, depth: 2, num_heads: 2, img_size: {SIDE}}}",
    "--data.image_size",
    str(SIDE),
    "--data.batch_size",
    "4",
    "--data.num_workers",
    "0",
    "--data.repeats",
    "1",
]


def test_attention_tool_draws_a_classifier_and_a_detector(
    detr_checkpoint: Path, detr_toy_cache: Path, tmp_path: Path
) -> None:
    toy = make_toy_classification(tmp_path / "cls", num_train_per_class=2, num_val_per_class=1, side=SIDE)
    deit = [*DEIT, "--data.root", str(toy)]
    run_tool_in_process(
        "train.py",
        *deit,
        "--trainer.max_steps",
        "1",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.logger",
        "false",
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    image = next((toy / "val").rglob("*.png"))
    run_tool_in_process(
        "attention.py",
        *deit,
        "--ckpt",
        str(next((tmp_path / "run").rglob("last.ckpt"))),
        "--image",
        str(image),
        "--out",
        str(tmp_path / "deit.png"),
        cwd=tmp_path,
    )
    picture = read_image(str(tmp_path / "deit.png"))
    assert picture.shape[1] < 2 * SIDE and picture.shape[2] >= 4 * SIDE  # input, rollout, 2 heads: one row of 4

    result = run_tool_in_process(
        "attention.py",
        *DETR_SMALL,
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--ckpt",
        str(detr_checkpoint),
        "--image",
        str(image),
        "--out",
        str(tmp_path / "detr.png"),
        "--score-threshold",
        "2",
        cwd=tmp_path,
    )
    assert "wrote" in result.stdout
    picture = read_image(str(tmp_path / "detr.png"))
    assert picture.shape[1] >= 2 * 96  # the input and the 4 best of 5 queries: two rows at the validation size

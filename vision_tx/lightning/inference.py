"""Run a trained checkpoint on one image and draw what it predicts (``tools/infer.py``, ``vision-tx infer``).

python tools/infer.py --config detr_swin_toy --ckpt runs/.../last.ckpt --image cat.jpg --out cat_pred.png
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageOps
from torchvision.io import write_png
from torchvision.transforms.v2.functional import pil_to_tensor

from vision_tx.lightning.cli import configured, resolve_config_args


def read_rgb_image(path: str | Path) -> torch.Tensor:
    """The image at ``path`` as ``[3,H,W]`` uint8 RGB, EXIF orientation applied."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: {path}: no such image file")
    try:
        with Image.open(path) as image:
            return pil_to_tensor(ImageOps.exif_transpose(image).convert("RGB"))
    except OSError as err:
        raise SystemExit(f"error: {path}: cannot be read as an image ({err})") from err


def load_trained(config_args: Sequence[str], ckpt: str | Path) -> tuple[Any, Any]:
    """The trained module of ``ckpt`` (its class from the config, in eval mode) and the config's datamodule.

    ``config_args`` are the usual ``--config NAME [--section.key value ...]``.
    """
    cli = configured(resolve_config_args(config_args))
    return type(cli.model).load_from_checkpoint(ckpt, map_location="cpu").eval(), cli.datamodule


def infer_image(config_args: Sequence[str], ckpt: str | Path, image: str | Path, out: str | Path) -> Path:
    """Loads the model of ``ckpt`` (its class from the config of ``config_args``, ``--config NAME ...``), predicts on
    ``image``, writes a PNG to ``out``.

    The config's datamodule supplies the validation resize and the class names.
    """
    module, datamodule = load_trained(config_args, ckpt)
    picture = module.draw_prediction(read_rgb_image(image), datamodule)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_png(picture, str(out))
    return out


def infer_main(argv: Sequence[str] | None = None) -> None:
    """``tools/infer.py``, ``vision-tx infer``: ``--ckpt``, ``--image``, ``--out`` and the config's arguments, from
    ``argv`` (the command line when None)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint of the model")
    parser.add_argument("--image", required=True, help="input image (any format PIL reads)")
    parser.add_argument("--out", required=True, help="output PNG")
    args, config_args = parser.parse_known_args(argv)
    print(f"wrote {infer_image(config_args, args.ckpt, args.image, args.out)}")

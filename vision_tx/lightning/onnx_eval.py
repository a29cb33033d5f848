"""An exported detector scored on a config's validation set in onnxruntime: the COCO table, ``metrics.json``, the
COCO results and the validation report (:mod:`vision_tx.metrics.detection_report`), as a checkpoint's validation gives
them.

    python tools/eval.py --onnx rtdetr.onnx --config rtdetr_convnext_toy --data.root /data/coco --out eval_onnx

The ONNX file is :mod:`vision_tx.export`'s: ``images [B,3,H,W]`` RGB in [0, 1] in, ``boxes [B,N,4]`` (xyxy pixels of the
input), ``scores [B,N]`` and ``labels [B,N]`` (category ids, -1 where per-class NMS left a slot empty) out. Each
validation image goes through the config's validation transform (its resize), unnormalised, one at a time at its own
size (no padding: the exported model reads no pixel mask); the boxes are scaled back to the original image.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vision_tx.data.invalid import InvalidDataError
from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vision_tx.lightning.cli import config_name, configured, resolve_config_args, show_library_log
from vision_tx.lightning.detection import DetectionModule
from vision_tx.metrics.coco import CocoEvaluator
from vision_tx.metrics.detection_report import write_validation_report

DETECTION_OUTPUTS = ["boxes", "scores", "labels"]


class OnnxEvalError(ValueError):
    """An ONNX file or a config that cannot be scored; the message is one line naming the file and the problem."""


def open_session(path: str | Path, threads: int = 0) -> Any:
    """An onnxruntime session of the exported detector at ``path`` (CPU; ``threads`` 0: onnxruntime's default), its
    input and outputs checked: ``images`` in, ``boxes``, ``scores``, ``labels`` out, a dynamic batch or a batch of 1."""
    path = Path(path)
    if not path.is_file():
        raise OnnxEvalError(f"{path}: no such ONNX file")
    try:
        import onnxruntime
    except ImportError as err:
        raise OnnxEvalError(f"{path}: scoring an ONNX file needs onnxruntime (pip install onnxruntime): {err}") from err
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own kinds for unreadable or invalid models
        raise OnnxEvalError(f"{path}: onnxruntime cannot load it: {str(err).strip().splitlines()[0]}") from err
    inputs, outputs = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]
    if inputs != ["images"] or outputs != DETECTION_OUTPUTS:
        raise OnnxEvalError(
            f"{path}: not an exported box detector (inputs {inputs}, outputs {outputs}; vision_tx.export's detectors "
            f"take images and give {', '.join(DETECTION_OUTPUTS)})"
        )
    batch = session.get_inputs()[0].shape[0]
    if isinstance(batch, int) and batch != 1:
        raise OnnxEvalError(
            f"{path}: exported at a fixed batch of {batch}; the images are scored one at a time: export it with a "
            "dynamic batch (tools/export.py without --batch)"
        )
    return session


def fixed_size(session: Any) -> tuple[int, int] | None:
    """The ``(height, width)`` the ONNX model of ``session`` (an onnxruntime ``InferenceSession``) was exported at when
    its size is fixed (``--fixed-size``), else None."""
    height, width = session.get_inputs()[0].shape[2:]
    return (height, width) if isinstance(height, int) and isinstance(width, int) else None


def unnormalize(image: torch.Tensor) -> torch.Tensor:
    """A validation ``image [3,H,W]`` normalised with the ImageNet mean and std -> ``[3,H,W]`` RGB in [0, 1], what an
    export reads."""
    mean, std = image.new_tensor(IMAGENET_MEAN)[:, None, None], image.new_tensor(IMAGENET_STD)[:, None, None]
    return image * std + mean


def detect(session: Any, image: torch.Tensor, size: torch.Tensor, orig_size: torch.Tensor) -> dict[str, torch.Tensor]:
    """The detections of the exported model of ``session`` (onnxruntime) for one normalised validation ``image``
    ``[3,H,W]`` (maybe padded) whose unpadded ``size`` and original ``orig_size`` are ``[2]`` (h, w): ``{"boxes" [K,4]
    xyxy in original pixels, "scores" [K], "labels" [K]}``, the empty NMS slots (label -1) left out."""
    height, width = (int(v) for v in size)
    pixels = unnormalize(image[:, :height, :width].float())[None].contiguous().numpy()
    boxes, scores, labels = (torch.from_numpy(array)[0] for array in session.run(DETECTION_OUTPUTS, {"images": pixels}))
    keep = labels >= 0
    scale = (orig_size.double() / size.double()).flip(0).repeat(2)  # (w, h, w, h)
    return {"boxes": boxes[keep].double() * scale, "scores": scores[keep], "labels": labels[keep]}


def evaluate_onnx(
    onnx_path: str | Path, config_args: Sequence[str], out: str | Path = ".", threads: int = 0
) -> dict[str, Any]:
    """Scores the exported detector at ``onnx_path`` (onnxruntime with ``threads`` threads, 0: its own choice) on the
    validation set of ``config_args`` (``--config NAME [--data.root DIR ...]``; no ``--data.root``: the toy set):
    prints pycocotools' table, the ten worst categories and the best F1, writes ``metrics.json``,
    ``bbox_results.json`` and the report's pictures into ``out``; returns the bbox section written."""
    session = open_session(onnx_path, threads)
    args = resolve_config_args(config_args)
    cli = configured(args)
    module, datamodule = cli.model, cli.datamodule
    if not isinstance(module, DetectionModule):
        raise OnnxEvalError(
            f"{config_name(args)}: {type(module).__name__} is no box detector; --onnx scores detection configs"
        )
    datamodule.setup("validate")
    fixed = fixed_size(session)
    evaluator = CocoEvaluator(datamodule.val_coco, "bbox")
    for batch in datamodule.val_dataloader():
        for image, target in zip(batch["images"], batch["targets"]):
            if fixed is not None and tuple(target["size"].tolist()) != fixed:
                raise OnnxEvalError(
                    f"{onnx_path}: exported at a fixed size {fixed[0]}x{fixed[1]}, "
                    f"but image {int(target['image_id'])} is "
                    f"{int(target['size'][0])}x{int(target['size'][1])} after {config_name(args)}'s validation resize: "
                    "export it with a dynamic size (tools/export.py without --fixed-size)"
                )
            detections = detect(session, image, target["size"], target["orig_size"])
            evaluator.update([{"image_id": int(target["image_id"]), **detections}])
    stats = evaluator.compute()
    out = Path(out)
    report, pictures = write_validation_report(evaluator, stats, out)
    best_f1, best_threshold = report.best
    print(evaluator.summary, end="")
    print(evaluator.table())
    print(
        f"best F1 {best_f1:.3f} at confidence {best_threshold:.2f}; confusion matrix, PR and F1 curves: "
        f"{', '.join(str(out / f'{name}.png') for name in pictures)}"
    )
    print(f"metrics: {out / 'metrics.json'}")
    return {**stats, **report.to_json(), "per_category": evaluator.per_category}


def main(argv: Sequence[str] | None = None) -> None:
    """``tools/eval.py --onnx FILE --config NAME [--section.key value ...] [--out DIR]``, from ``argv`` (the command
    line when None)."""
    parser = argparse.ArgumentParser(
        prog="tools/eval.py --onnx", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--onnx", required=True, help="the exported detector (tools/export.py --format onnx)")
    parser.add_argument(
        "--out",
        default=".",
        help="folder of the metrics.json, results and pictures written (default: the working directory)",
    )
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime's threads (default 0: its own choice)")
    args, config_args = parser.parse_known_args(argv)
    if "--config" not in " ".join(config_args):
        parser.error("--config is required (the validation set and its resize come from it)")
    show_library_log()
    try:
        evaluate_onnx(args.onnx, config_args, args.out, args.threads)
    except (OnnxEvalError, InvalidDataError) as err:
        raise SystemExit(f"error: {err}") from None

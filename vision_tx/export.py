"""Trained models for deployment: ONNX (for onnxruntime) or a ``torch.export`` ExportedProgram, with the
post-processing inside.

    python tools/export.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --format onnx --out model.onnx

Every exported model takes ``images``: float ``[B,3,H,W]``, RGB scaled to [0, 1] (as Ultralytics' exports),
normalised inside with the ImageNet mean and standard deviation the data pipeline uses; resizing stays with
the caller (the config's validation resize is what the model was trained and validated at). Its outputs, by task:

- classification: ``probabilities [B,C]``, ``top_labels [B,k]`` and ``top_scores [B,k]`` (``k = min(5, C)``);
- detection (DETR, DINO, RT-DETR, D-FINE): ``boxes [B,N,4]`` (absolute xyxy in pixels of the input), ``scores [B,N]``,
  ``labels [B,N]`` (category ids); a detector with per-class NMS puts its kept detections first, best first,
  and fills the rest with score 0 and label -1;
- instance segmentation (Mask2Former): ``scores``, ``labels`` and bool ``masks [B,N,H,W]``, best first;
- panoptic segmentation (Mask2Former, DETR): ``segment_ids [B,H,W]`` (0: void, segments 1..S), and per segment
  ``segment_labels [B,Q]`` and ``segment_scores [B,Q]`` (segment ``i`` at index ``i - 1``; label -1 past S);
- semantic segmentation (UperNet, Mask2Former): ``probabilities [B,C,H,W]`` and ``labels [B,H,W]``.

The batch is dynamic (``--batch N`` fixes it): ``torch.export`` must keep it a symbol (``Dim.DYNAMIC``), so code
that fixes it fails the export instead of giving a graph that breaks at another batch in onnxruntime (as ``len()``
of a tensor did, which Python turns into an int: DINO's and RT-DETR's query expansion, Mask2Former's sizes).
The image size is dynamic where the model allows it (``torch.export`` with ``Dim.AUTO``: a model
whose code fixes a size, such as NAT's neighbourhood tiling, exports at the example size and says so); not in
ONNX for Swin backbones, which :func:`export` refuses (its message names the operator): export them at a fixed size.
Both formats come from the same ``torch.export`` trace; ONNX through ``torch.onnx.export(dynamo=True)``.
What is traced is a copy of the model rewritten for inference (:func:`vision_tx.deploy.fuse_for_deployment`: BatchNorms
folded into convolutions, RepVGG blocks merged, deformable attention as one GridSample per level), the same outputs
up to float rounding. Deployed at one size, ``--fixed-size --batch 1`` gives onnxruntime static shapes, so that it
folds the anchors, masks and position encodings into constants (``tools/benchmark.py export`` measures that form).
"""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torchvision.ops import nms

from vision_tx.backbones.swin import SwinBlock
from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vision_tx.deploy import fuse_for_deployment
from vision_tx.heads.detr.postprocess import NMS_CANDIDATES, pixel_boxes, postprocess_panoptic, sigmoid_candidates
from vision_tx.heads.mask2former.postprocess import instance_candidates, resize_masks
from vision_tx.models import DETR, Mask2Former
from vision_tx.models.query_detector import DeformableQueryDetector

FORMATS = ("onnx", "exported_program")
TOP_CLASSES = 5  # the classifiers' top_labels / top_scores
DETR_PANOPTIC_DEFAULTS = {  # threshold, min_area: what DETRPanoptic's postprocess_kwargs override
    name: parameter.default for name, parameter in inspect.signature(postprocess_panoptic).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


class ExportError(RuntimeError):
    """A model that cannot be exported; the message is one line naming the model and the reason."""


class Deployable(nn.Module):
    """A trained network and its post-processing as one module of ``images [B,3,H,W]`` in [0, 1]:
    ``forward`` returns the tensors of ``output_names``, in that order."""

    output_names: tuple[str, ...] = ()

    def __init__(self, network: nn.Module, name: str) -> None:
        super().__init__()
        self.network = network
        self.name = name  # what error messages call it (the config's name)
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` in [0, 1] -> what the network reads."""
        return (images - self.pixel_mean.to(images.dtype)) / self.pixel_std.to(images.dtype)


class ClassifierExport(Deployable):
    """``module(images) -> logits [B,C]`` (a classification module) -> probabilities and the top classes."""

    output_names = ("probabilities", "top_labels", "top_scores")

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probabilities = self.network(self.normalize(images)).softmax(-1)
        top_scores, top_labels = probabilities.topk(min(TOP_CLASSES, probabilities.shape[-1]), dim=-1)
        return probabilities, top_labels, top_scores


class SemanticExport(Deployable):
    """``module(images) -> probabilities [B,C,H,W]`` (a segmentation module) -> probabilities and the label map."""

    output_names = ("probabilities", "labels")

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probabilities = self.network(self.normalize(images))
        return probabilities, probabilities.argmax(1)


def image_sizes(images: torch.Tensor) -> torch.Tensor:
    """``[B,2]`` (h, w) of ``images [B,3,H,W]``: boxes and masks come out in the input's pixels."""
    height, width = images.shape[-2:]
    return torch.tensor([height, width], device=images.device).expand(images.shape[0], 2)


class SoftmaxDetectionExport(Deployable):
    """DETR: one detection per query, its most probable real class (``postprocess_detections``)."""

    output_names = ("boxes", "scores", "labels")

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        scores, labels = outputs["pred_logits"].softmax(-1)[..., :-1].max(-1)
        return pixel_boxes(outputs["pred_boxes"], image_sizes(images)), scores, labels


class SigmoidDetectionExport(Deployable):
    """DINO, RT-DETR, D-FINE: the best (query, class) pairs, through per-class NMS when the detector has it
    (``postprocess_sigmoid_detections``)."""

    output_names = ("boxes", "scores", "labels")

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        count, threshold = self.network.num_detections, self.network.nms_threshold
        candidates = count if threshold is None else max(count, NMS_CANDIDATES)
        scores, labels, boxes = sigmoid_candidates(outputs, candidates, self.network.share_scores)
        boxes = pixel_boxes(boxes, image_sizes(images))
        if threshold is None:
            return boxes, scores, labels
        keep = batched_nms_mask(boxes, scores, labels, threshold)
        # The kept candidates first, in their (best-first) order: a unique key per candidate, so no ties.
        candidates = scores.shape[1]
        order = (torch.arange(candidates, device=scores.device) + candidates * (~keep).long()).argsort(dim=1)[:, :count]
        scores, labels = (scores * keep).gather(1, order), labels.masked_fill(~keep, -1).gather(1, order)
        return boxes.gather(1, order[..., None].expand(-1, -1, 4)), scores, labels


def batched_nms_mask(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which of the detections ``boxes [B,K,4]`` (xyxy), ``scores [B,K]``, ``labels [B,K]`` survive per-image,
    per-class NMS at IoU ``threshold``: ``bool [B,K]``. One ``torchvision.ops.nms`` over all images, each
    (image, class) pair moved to its own region (torchvision's ``batched_nms`` trick; ONNX's NonMaxSuppression)."""
    batch, candidates = scores.shape
    groups = labels + (labels.max() + 1) * torch.arange(batch, device=labels.device)[:, None]
    offsets = (groups * (boxes.max() + 1)).to(boxes)[..., None]
    kept = nms((boxes + offsets).flatten(0, 1), scores.flatten(), threshold)
    return torch.zeros(batch * candidates, dtype=torch.bool, device=boxes.device).index_fill(0, kept, True).view(batch, candidates)


class InstanceExport(Deployable):
    """Mask2Former's instance inference (``instance_inference``), masks at the input's size."""

    output_names = ("scores", "labels", "masks")

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        size = tuple(images.shape[-2:])
        masks = resize_masks(outputs["pred_masks"], size, size)
        scores, labels, foreground = instance_candidates(outputs["pred_logits"], masks, self.network.test_topk)
        order = scores.argsort(dim=1, descending=True)
        return scores.gather(1, order), labels.gather(1, order), foreground.gather(1, order[..., None, None].expand_as(foreground))


class PanopticExport(Deployable):
    """The panoptic outputs shared by Mask2Former's and DETR's exports: ``segment_ids [B,H,W]`` and, per segment,
    ``segment_labels`` and ``segment_scores``. ``is_thing``: category id -> thing (ids not in it count as stuff)."""

    output_names = ("segment_ids", "segment_labels", "segment_scores")

    def __init__(self, network: nn.Module, name: str, is_thing: Mapping[int, bool]) -> None:
        super().__init__(network, name)
        thing = torch.zeros(network.num_classes + 1, dtype=torch.bool)
        known = torch.zeros(network.num_classes + 1, dtype=torch.bool)
        for category, value in is_thing.items():
            if 0 <= category < network.num_classes:
                thing[category], known[category] = bool(value), True
        self.register_buffer("thing", thing, persistent=False)
        self.register_buffer("known", known, persistent=False)

    def number_segments(self, classes: torch.Tensor, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Segments of the ``accepted [B,Q]`` queries of ``classes [B,Q]``, numbered 1..S in query order, the queries
        of one stuff class sharing the segment of the first: ``segment_of_query [B,Q]`` (0: none), and which queries
        start a segment (``starts [B,Q]``) with its number (``ids [B,Q]``, 0 elsewhere)."""
        index = torch.arange(classes.shape[1], device=classes.device)
        # For each query, the first accepted query of its class at or before it (a stuff query's segment's owner).
        same = (classes[:, :, None] == classes[:, None, :]) & accepted[:, None, :] & (index[None, :] <= index[:, None])
        first = torch.where(self.thing[classes], index, same.long().argmax(-1))
        starts = accepted & (first == index)
        ids = torch.cumsum(starts.long(), 1) * starts
        return torch.where(accepted, ids.gather(1, first), 0), starts, ids

    @staticmethod
    def per_segment(values: torch.Tensor, starts: torch.Tensor, ids: torch.Tensor, fill: float) -> torch.Tensor:
        """``values [B,Q]`` of the queries that start segments, segment ``i`` at index ``i - 1``, ``fill`` past the last."""
        queries = values.shape[1]
        slot = torch.where(starts, ids - 1, queries)
        return values.new_full((values.shape[0], queries + 1), fill).scatter(1, slot, values)[:, :queries]


class Mask2FormerPanopticExport(PanopticExport):
    """Mask2Former's panoptic inference (``panoptic_inference``) for a batch, without Python loops: queries whose
    best class is real and above ``object_mask_threshold`` compete for each pixel (score times mask probability);
    a query's segment is its won pixels of probability >= 0.5, kept when it holds ``overlap_threshold`` of the
    query's own mask; the queries of one stuff class share the segment of the first."""

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        size = tuple(images.shape[-2:])
        logits, masks = outputs["pred_logits"], resize_masks(outputs["pred_masks"], size, size)
        queries = logits.shape[1]
        scores, classes = logits.softmax(-1).max(-1)  # [B,Q]
        keep = (classes != logits.shape[-1] - 1) & (scores > self.network.object_mask_threshold)
        probs = masks.sigmoid()  # [B,Q,H,W]
        owner = torch.where(keep[..., None, None], scores[..., None, None] * probs, float("-inf")).argmax(1)  # [B,H,W]
        won = owner[:, None] == torch.arange(queries, device=owner.device)[None, :, None, None]
        own = probs >= 0.5
        segment = won & own
        area, own_area = won.flatten(2).sum(2), own.flatten(2).sum(2)
        ratio = area.double() / own_area.clamp(min=1).double()
        accepted = keep & (area > 0) & (own_area > 0) & segment.flatten(2).any(2) & (ratio >= self.network.overlap_threshold)
        segment_of_query, starts, ids = self.number_segments(classes, accepted)
        segment_ids = (segment.long() * segment_of_query[..., None, None]).sum(1)
        return segment_ids, self.per_segment(classes, starts, ids, -1), self.per_segment(scores, starts, ids, 0.0)


class DETRPanopticExport(PanopticExport):
    """DETR's panoptic post-processing (``heads.detr.postprocess_panoptic``) for a batch, without its loop.

    Queries whose most probable class is a known real category above ``threshold`` compete for each pixel by
    mask logit (masks upsampled 4x); segments of at most ``min_area`` pixels are dropped and their pixels
    re-assigned. Two rounds are the eager loop exactly: dropping queries only hands their pixels to the others, so
    every segment that survives the first round only grows, and the second round drops nothing."""

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        settings = {**DETR_PANOPTIC_DEFAULTS, **self.network.postprocess_kwargs}
        logits, height, width = outputs["pred_logits"], images.shape[-2], images.shape[-1]
        mask_logits = nn.functional.interpolate(outputs["pred_masks"], scale_factor=4, mode="bilinear", align_corners=False)
        mask_logits = mask_logits[..., :height, :width]  # [B,Q,H,W]
        scores, classes = logits.softmax(-1).max(-1)  # [B,Q]
        kept = (classes != logits.shape[-1] - 1) & (scores > settings["threshold"]) & self.known[classes]
        for _ in range(2):
            segment_of_query, starts, ids = self.number_segments(classes, kept)
            owner = torch.where(kept[..., None, None], mask_logits, float("-inf")).argmax(1)  # [B,H,W]
            segment_ids = segment_of_query.gather(1, owner.flatten(1)).view_as(owner)
            pixels = segment_ids.flatten(1)
            area = pixels.new_zeros(scores.shape[0], scores.shape[1] + 1).scatter_add(1, pixels, torch.ones_like(pixels))  # by segment
            kept = kept & (area.gather(1, segment_of_query) > settings["min_area"])
        return segment_ids, self.per_segment(classes, starts, ids, -1), self.per_segment(scores, starts, ids, 0.0)


# What each detector's detections are made of, by its class (``DetectionModule.detector_class``) or nearest base class.
DETECTION_EXPORTS: dict[type[nn.Module], type[Deployable]] = {
    DETR: SoftmaxDetectionExport, DeformableQueryDetector: SigmoidDetectionExport, Mask2Former: InstanceExport,
}


PANOPTIC_EXPORTS: dict[type[nn.Module], type[PanopticExport]] = {DETR: DETRPanopticExport, Mask2Former: Mask2FormerPanopticExport}


def deployable(module: nn.Module, name: str = "model", is_thing: Mapping[int, bool] | None = None) -> Deployable:
    """The exportable form of a trained task module (``vision_tx.lightning``): its network, in eval mode, and
    its task's post-processing. ``name`` is what errors call it; ``is_thing`` (category id -> thing) is needed
    by panoptic models (the datamodule's ``is_thing``)."""
    from vision_tx.lightning.classification import ClassificationModule
    from vision_tx.lightning.detection import DetectionModule
    from vision_tx.lightning.panoptic import PanopticModule
    from vision_tx.lightning.segmentation import SegmentationModule

    module = module.eval()
    if isinstance(module, ClassificationModule):
        return ClassifierExport(module, name).eval()
    if isinstance(module, SegmentationModule):
        return SemanticExport(module, name).eval()
    if not isinstance(module, DetectionModule):
        raise ExportError(f"{name}: {type(module).__name__} is not a vision_tx task module (classification, detection, segmentation)")
    if isinstance(module, PanopticModule):
        if is_thing is None:
            raise ExportError(f"{name}: a panoptic model needs is_thing (category id -> thing) to export")
        return PANOPTIC_EXPORTS[module.detector_class](module.model, name, is_thing).eval()
    export_class = next((DETECTION_EXPORTS[c] for c in module.detector_class.__mro__ if c in DETECTION_EXPORTS), None)
    if export_class is None:
        raise ExportError(f"{name}: no export for the detector {module.detector_class.__name__} (vision_tx.export.DETECTION_EXPORTS)")
    return export_class(module.model, name).eval()


def example_images(size: Sequence[int] = (128, 128), batch: int = 2, seed: int = 0) -> torch.Tensor:
    """Random ``[batch,3,H,W]`` images in [0, 1], the example an export traces (a dynamic batch needs 2 or more)."""
    return torch.rand(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


def export_program(model: Deployable, images: torch.Tensor, dynamic_size: bool = True, dynamic_batch: bool = True) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` on ``images``, its batch dynamic (``dynamic_batch``: ``Dim.DYNAMIC``, an error
    if the code fixes it) and its image size (``dynamic_size``) where the code allows (``Dim.AUTO``), fixed at ``images``' otherwise. Raises :class:`ExportError` (one
    line: the model and the operator or reason) when it fails. A dynamic image size makes the trace several
    times slower (symbolic shapes)."""
    dims = {**({0: torch.export.Dim.DYNAMIC} if dynamic_batch else {}),
            **({2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO} if dynamic_size else {})}
    try:
        with torch.no_grad():
            return torch.export.export(model.eval(), (images,), dynamic_shapes=(dims,))
    except Exception as err:  # torch.export raises many kinds; the first line names the operator or guard
        raise ExportError(f"{model.name}: torch.export failed: {first_line(err)}") from err


def dynamic_dims(program: torch.export.ExportedProgram) -> dict[str, int | None]:
    """``{"batch", "height", "width"}`` of the program's input: None where dynamic, the fixed size otherwise."""
    placeholder = next(node for node in program.graph.nodes if node.op == "placeholder" and node.name == program.graph_signature.user_inputs[0])
    shape = placeholder.meta["val"].shape
    return {name: (int(shape[i]) if isinstance(shape[i], int) else None) for name, i in (("batch", 0), ("height", 2), ("width", 3))}


def first_line(err: BaseException) -> str:
    """The first non-empty line of ``err``'s message, with its type."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def export(model: Deployable, out: str | Path, format: str = "onnx", images: torch.Tensor | None = None,
           dynamic_size: bool = True, dynamic_batch: bool = True, fuse: bool = True) -> dict[str, Any]:
    """Writes ``model`` (see :func:`deployable`) to ``out`` as ONNX or as an ExportedProgram (``torch.export.save``),
    traced on ``images`` (default: :func:`example_images`; see :func:`export_program`); with ``fuse``, a copy of it
    rewritten for inference (:func:`vision_tx.deploy.fuse_for_deployment`: BatchNorms folded, the same outputs up to
    float rounding; ``model`` is left as it is). Returns ``{"path", "format", "dims", "inputs", "outputs"}``
    (``dims``: see :func:`dynamic_dims`)."""
    if format not in FORMATS:
        raise ExportError(f"{model.name}: unknown format {format!r}; choose from {', '.join(FORMATS)}")
    images = example_images() if images is None else images
    if format == "onnx" and dynamic_size and any(isinstance(module, SwinBlock) for module in model.modules()):
        raise ExportError(f"{model.name}: no dynamic image size in ONNX for Swin: its window tables take a remainder by the padded map "
                          "size (aten.remainder.Scalar of a symbol, no ONNX translation) and, that rewritten, its window partition's "
                          "Reshape fails in onnxruntime; export a fixed size (--fixed-size)")
    if fuse:
        model = fuse_for_deployment(copy.deepcopy(model).eval())
    program = export_program(model, images, dynamic_size, dynamic_batch)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if format == "exported_program":
        torch.export.save(program, out)
    else:
        try:
            torch.onnx.export(program, (images,), str(out), input_names=["images"], output_names=list(model.output_names),
                              dynamo=True, external_data=False, verbose=False,
                              optimize=False)  # onnxscript 0.7.2's optimiser wrote an invalid DINO graph (a lost input); onnxruntime optimises anyway
        except Exception as err:
            operators = sorted(set(re.findall(r"\w+::\w+(?:\.\w+)?", str(err))))
            detail = f"no ONNX translation for {', '.join(operators)}" if operators else first_line(err)
            raise ExportError(f"{model.name}: ONNX export failed: {detail}") from err
    return {"path": out, "format": format, "dims": dynamic_dims(program), "inputs": ["images"], "outputs": list(model.output_names)}


def export_checkpoint(config_args: Sequence[str], ckpt: str | Path, out: str | Path, format: str = "onnx",
                      size: Sequence[int] = (128, 128), dynamic_size: bool = True, batch: int | None = None) -> dict[str, Any]:
    """Loads the trained module of ``ckpt`` (its class from ``config_args``: ``--config NAME [--section.key value]``)
    and exports it with :func:`export`, traced on images of ``size`` (h, w), at a fixed ``batch`` (None: dynamic,
    traced at 2). A panoptic model reads its things and stuff from the config's datamodule."""
    from vision_tx.lightning.cli import config_name, resolve_config_args
    from vision_tx.lightning.inference import load_trained

    from vision_tx.lightning.panoptic import PanopticModule

    module, datamodule = load_trained(config_args, ckpt)
    name = config_name(resolve_config_args(config_args))
    is_thing = datamodule.is_thing if isinstance(module, PanopticModule) else None
    images = example_images(size, 2 if batch is None else batch)
    return export(deployable(module, name, is_thing), out, format, images, dynamic_size, dynamic_batch=batch is None)


def main(argv: Sequence[str] | None = None) -> None:
    """``tools/export.py``: ``--config NAME --ckpt PATH --format onnx|exported_program --out FILE [--size H W]
    [--fixed-size]``; prints what was written, its inputs, outputs and which dimensions are dynamic."""
    import argparse

    parser = argparse.ArgumentParser(prog="tools/export.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint of the model")
    parser.add_argument("--format", default="onnx", choices=FORMATS)
    parser.add_argument("--out", required=True, help="the file to write (.onnx, or .pt2 for an ExportedProgram)")
    parser.add_argument("--size", nargs=2, type=int, default=(128, 128), metavar=("H", "W"), help="example image size traced (default 128 128)")
    parser.add_argument("--fixed-size", action="store_true",
                        help="export at --size only (several times faster to export; with --batch 1 the fastest graph in onnxruntime)")
    parser.add_argument("--batch", type=int, default=0, help="a fixed batch size to export (default 0: dynamic)")
    args, config_args = parser.parse_known_args(argv)
    if "--config" not in " ".join(config_args):
        parser.error("--config is required")
    try:
        info = export_checkpoint(config_args, args.ckpt, args.out, args.format, args.size, not args.fixed_size, args.batch or None)
    except ExportError as err:
        raise SystemExit(f"error: {err}") from None
    dims = ", ".join(f"{k} {'dynamic' if v is None else v}" for k, v in info["dims"].items())
    print(f"wrote {info['path']} ({info['format']}): input images [B,3,H,W] in [0, 1] ({dims}); outputs {', '.join(info['outputs'])}")

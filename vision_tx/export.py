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

A detector's outputs are its own ``detections(outputs, image_sizes)`` (a panoptic model's its ``panoptic_segments``),
the batch post-processing whose per-image cut is its eager ``postprocess``: eager and exported results come from one
function, and a new detector exports by implementing it. The task module's ``deployed_as`` picks the wrapper.

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
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vision_tx.deploy import fuse_for_deployment
from vision_tx.heads.detr.postprocess import thing_table

FORMATS = ("onnx", "exported_program")
TOP_CLASSES = 5  # the classifiers' top_labels / top_scores


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

    @classmethod
    def of(cls, module: nn.Module, name: str, is_thing: Mapping[int, bool] | None) -> Deployable:
        """The wrapper of the task module ``module`` (see :func:`deployable`): here the module itself."""
        return cls(module, name)


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


class DetectionExport(Deployable):
    """A detector's own batch post-processing (its ``detections(outputs, image_sizes)``, what its eager ``postprocess``
    cuts per image): the outputs its ``detection_outputs`` name, in pixels of the input."""

    def __init__(self, network: nn.Module, name: str) -> None:
        super().__init__(network, name)
        self.output_names = tuple(network.detection_outputs)

    @classmethod
    def of(cls, module: nn.Module, name: str, is_thing: Mapping[int, bool] | None) -> DetectionExport:
        """The wrapper of a detection task module's detector (``module.model``)."""
        if not callable(getattr(module.model, "detections", None)):
            detector = type(module.model).__name__
            raise ExportError(f"{name}: the detector {detector} has no detections(outputs, image_sizes) to export")
        return cls(module.model, name)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        detections = self.network.detections(self.network(self.normalize(images)), image_sizes(images))
        return tuple(detections[name] for name in self.output_names)


class PanopticExport(Deployable):
    """A panoptic model's own batch segment maps (its ``panoptic_segments(outputs, size, thing, known)``, what its
    eager ``postprocess_panoptic`` gives per image): ``segment_ids [B,H,W]`` and, per segment, ``segment_labels``
    and ``segment_scores``. ``is_thing``: category id -> thing (ids not in it count as stuff)."""

    output_names = ("segment_ids", "segment_labels", "segment_scores")

    def __init__(self, network: nn.Module, name: str, is_thing: Mapping[int, bool]) -> None:
        super().__init__(network, name)
        thing, known = thing_table(is_thing, network.num_classes)
        self.register_buffer("thing", thing, persistent=False)
        self.register_buffer("known", known, persistent=False)

    @classmethod
    def of(cls, module: nn.Module, name: str, is_thing: Mapping[int, bool] | None) -> PanopticExport:
        """The wrapper of a panoptic task module's model (``module.model``); ``is_thing`` is required."""
        if is_thing is None:
            raise ExportError(f"{name}: a panoptic model needs is_thing (category id -> thing) to export")
        return cls(module.model, name, is_thing)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        return self.network.panoptic_segments(outputs, tuple(images.shape[-2:]), self.thing, self.known)


# What each task module deploys as (its ``deployed_as``): the wrapper of its network.
EXPORTS: dict[str, type[Deployable]] = {
    "classification": ClassifierExport,
    "semantic": SemanticExport,
    "detection": DetectionExport,
    "panoptic": PanopticExport,
}


def deployable(module: nn.Module, name: str = "model", is_thing: Mapping[int, bool] | None = None) -> Deployable:
    """The exportable form of ``module``, a trained task module (``vision_tx.lightning``): its network, in eval mode,
    and its task's post-processing (the module's ``deployed_as`` names it; a detector's is its own). ``name`` is what
    errors call it; ``is_thing`` (category id -> thing) is needed by panoptic models (the datamodule's ``is_thing``)."""
    export_class = EXPORTS.get(getattr(module, "deployed_as", None))
    if export_class is None:
        raise ExportError(
            f"{name}: {type(module).__name__} is not a vision_tx task module (classification, detection, segmentation)"
        )
    return export_class.of(module.eval(), name, is_thing).eval()


def example_images(size: Sequence[int] = (128, 128), batch: int = 2, seed: int = 0) -> torch.Tensor:
    """Random ``[batch,3,H,W]`` images in [0, 1] (``size`` is ``(H, W)``, ``batch`` of them, drawn from ``seed``), the
    example an export traces (a dynamic batch needs 2 or more)."""
    return torch.rand(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


def export_program(
    model: Deployable, images: torch.Tensor, dynamic_size: bool = True, dynamic_batch: bool = True
) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` on ``images``, its batch dynamic (``dynamic_batch``: ``Dim.DYNAMIC``, an error
    if the code fixes it) and its image size (``dynamic_size``) where the code allows (``Dim.AUTO``), fixed at
    ``images``' otherwise. Raises :class:`ExportError` (one line: the model and the operator or reason) when it
    fails. A dynamic image size makes the trace several times slower (symbolic shapes)."""
    dims = {
        **({0: torch.export.Dim.DYNAMIC} if dynamic_batch else {}),
        **({2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO} if dynamic_size else {}),
    }
    try:
        with torch.no_grad():
            return torch.export.export(model.eval(), (images,), dynamic_shapes=(dims,))
    except Exception as err:  # torch.export raises many kinds; the first line names the operator or guard
        raise ExportError(f"{model.name}: torch.export failed: {first_line(err)}") from err


def dynamic_dims(program: torch.export.ExportedProgram) -> dict[str, int | None]:
    """``{"batch", "height", "width"}`` of the input ``images [B,3,H,W]`` of ``program``: None where dynamic, the
    fixed size otherwise."""
    placeholder = next(
        node
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name == program.graph_signature.user_inputs[0]
    )
    shape = placeholder.meta["val"].shape
    dims = (("batch", 0), ("height", 2), ("width", 3))
    return {name: (int(shape[i]) if is_concrete_int(shape[i]) else None) for name, i in dims}


def first_line(err: BaseException) -> str:
    """The first non-empty line of ``err``'s message, with its type."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def export(
    model: Deployable,
    out: str | Path,
    format: str = "onnx",
    images: torch.Tensor | None = None,
    dynamic_size: bool = True,
    dynamic_batch: bool = True,
    fuse: bool = True,
) -> dict[str, Any]:
    """Writes ``model`` (see :func:`deployable`) to ``out`` as ONNX or as an ExportedProgram (``torch.export.save``), as
    ``format`` says (``"onnx"`` or ``"exported_program"``), traced on ``images [B,3,H,W]`` (default:
    :func:`example_images`; see :func:`export_program`), its batch dynamic with ``dynamic_batch`` and its image size
    with ``dynamic_size``; with ``fuse``, a copy of it rewritten for inference
    (:func:`vision_tx.deploy.fuse_for_deployment`: BatchNorms folded, the same outputs up to float rounding; ``model``
    is left as it is). Returns ``{"path", "format", "dims", "inputs", "outputs"}`` (``dims``: see
    :func:`dynamic_dims`)."""
    if format not in FORMATS:
        raise ExportError(f"{model.name}: unknown format {format!r}; choose from {', '.join(FORMATS)}")
    images = example_images() if images is None else images
    # A module that fixes the image size in ONNX says why (``onnx_fixed_size_reason``, e.g. Swin's blocks).
    reason = next(filter(None, (getattr(m, "onnx_fixed_size_reason", None) for m in model.modules())), None)
    if format == "onnx" and dynamic_size and reason:
        raise ExportError(f"{model.name}: {reason}; export a fixed size (--fixed-size)")
    if fuse:
        model = fuse_for_deployment(copy.deepcopy(model).eval())
    program = export_program(model, images, dynamic_size, dynamic_batch)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if format == "exported_program":
        torch.export.save(program, out)
    else:
        try:
            torch.onnx.export(
                program,
                (images,),
                str(out),
                input_names=["images"],
                output_names=list(model.output_names),
                dynamo=True,
                external_data=False,
                verbose=False,
                optimize=False,
            )  # onnxscript 0.7.2's optimiser wrote an invalid DINO graph (a lost input); onnxruntime optimises anyway
        except Exception as err:
            operators = sorted(set(re.findall(r"\w+::\w+(?:\.\w+)?", str(err))))
            detail = f"no ONNX translation for {', '.join(operators)}" if operators else first_line(err)
            raise ExportError(f"{model.name}: ONNX export failed: {detail}") from err
    return {
        "path": out,
        "format": format,
        "dims": dynamic_dims(program),
        "inputs": ["images"],
        "outputs": list(model.output_names),
    }


def export_checkpoint(
    config_args: Sequence[str],
    ckpt: str | Path,
    out: str | Path,
    format: str = "onnx",
    size: Sequence[int] = (128, 128),
    dynamic_size: bool = True,
    batch: int | None = None,
) -> dict[str, Any]:
    """Loads the trained module of ``ckpt`` (its class from ``config_args``: ``--config NAME [--section.key value]``)
    and exports it to ``out`` in ``format`` with :func:`export`, traced on images of ``size`` (h, w), the image size
    dynamic with ``dynamic_size``, at a fixed ``batch`` (None: dynamic, traced at 2). A panoptic model reads its things
    and stuff from the config's datamodule."""
    from vision_tx.lightning.cli import config_name, resolve_config_args
    from vision_tx.lightning.inference import load_trained

    module, datamodule = load_trained(config_args, ckpt)
    name = config_name(resolve_config_args(config_args))
    is_thing = datamodule.is_thing if getattr(module, "deployed_as", None) == "panoptic" else None
    images = example_images(size, 2 if batch is None else batch)
    return export(deployable(module, name, is_thing), out, format, images, dynamic_size, dynamic_batch=batch is None)


def main(argv: Sequence[str] | None = None) -> None:
    """``tools/export.py``: ``--config NAME --ckpt PATH --format onnx|exported_program --out FILE [--size H W]
    [--fixed-size]`` read from ``argv`` (default: the process's arguments); prints what was written, its inputs,
    outputs and which dimensions are dynamic."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tools/export.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint of the model")
    parser.add_argument("--format", default="onnx", choices=FORMATS)
    parser.add_argument("--out", required=True, help="the file to write (.onnx, or .pt2 for an ExportedProgram)")
    parser.add_argument(
        "--size",
        nargs=2,
        type=int,
        default=(128, 128),
        metavar=("H", "W"),
        help="example image size traced (default 128 128)",
    )
    parser.add_argument(
        "--fixed-size",
        action="store_true",
        help="export at --size only (several times faster to export; with --batch 1 the fastest graph in onnxruntime)",
    )
    parser.add_argument("--batch", type=int, default=0, help="a fixed batch size to export (default 0: dynamic)")
    args, config_args = parser.parse_known_args(argv)
    if "--config" not in " ".join(config_args):
        parser.error("--config is required")
    try:
        info = export_checkpoint(
            config_args, args.ckpt, args.out, args.format, args.size, not args.fixed_size, args.batch or None
        )
    except ExportError as err:
        raise SystemExit(f"error: {err}") from None
    dims = ", ".join(f"{k} {'dynamic' if v is None else v}" for k, v in info["dims"].items())
    print(
        f"wrote {info['path']} ({info['format']}): input images [B,3,H,W] in [0, 1] ({dims}); "
        f"outputs {', '.join(info['outputs'])}"
    )

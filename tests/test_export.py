"""Exported models in onnxruntime against the eager model and its own post-processing (vision_tx/export.py).

Every task module is built from its config (the toy-sized ones; UperNet on a quarter-width Swin), its weights
perturbed (tests/parity.py), exported to ONNX once and run in onnxruntime at two batch sizes, and, for the models whose
image size is dynamic (not Swin's), at a second image size: floating outputs within 1e-4 of the eager wrapper's, which
itself gives exactly the model's eager post-processing (the lists ``postprocess`` and friends return)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torchvision.transforms.v2.functional import normalize

from tests.conftest import require_reference
from tests.parity import perturb_
from vision_tx.config_loader import load_config
from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vision_tx.export import FORMATS, DetectionExport, ExportError, deployable, example_images, export, main
from vision_tx.lightning.cli import resolve_config

NUM_CLASSES = 4
IS_THING = {0: True, 1: True, 2: False, 3: False}
TOLERANCE = 1e-4  # measured: <= 3e-6 on every output (float32, onnxruntime's CPU provider)
CLASS_LOGIT_SCALE = 20.0  # softmax heads; sigmoid heads (DINO, RT-DETR) keep theirs: x20 saturates scores at 1.0 (ties)


def build_task(config: str, seed: int = 0, class_scale: float = CLASS_LOGIT_SCALE, **init_args: Any) -> torch.nn.Module:
    """The task module of ``configs/<config>.yaml`` (its ``model`` section, ``init_args`` overriding), with
    ``NUM_CLASSES`` classes, built, weights perturbed, class heads scaled by ``class_scale``, in eval mode."""
    section = load_config(resolve_config(config))["model"]
    module_name, _, class_name = section["class_path"].rpartition(".")
    module_class = getattr(importlib.import_module(module_name), class_name)
    torch.manual_seed(seed)  # the initialisation that perturb_ moves from: the same model on every run
    module = module_class(**{**section.get("init_args", {}), "num_classes": NUM_CLASSES, **init_args})
    module.configure_model()
    perturb_(module, seed)
    with (
        torch.no_grad()
    ):  # class logits spread far apart: no near-ties for float rounding to reorder, confident panoptic queries
        for name, parameter in module.named_parameters():
            if "class_embed" in name:
                parameter.mul_(class_scale)
    return module.eval()


def detector_kwargs(config: str) -> dict[str, Any]:
    """The ``detector_kwargs`` of ``configs/<config>.yaml``."""
    return dict(load_config(resolve_config(config))["model"]["init_args"]["detector_kwargs"])


def run_onnx(path: Path, images: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of the ONNX model at ``path`` for ``images``, in onnxruntime (one thread: the CI's 2 cores are
    shared)."""
    onnxruntime = require_reference("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [torch.from_numpy(array) for array in session.run(None, {"images": images.numpy()})]


def assert_outputs_close(
    got: list[torch.Tensor], expected: tuple[torch.Tensor, ...], names: tuple[str, ...], rtol: float = 0.0
) -> None:
    """Floating outputs within ``TOLERANCE`` (plus ``rtol`` of their size: full-size pixel boxes,
    scripts/export_every_config.py), the others (labels, masks, segment maps) equal."""
    assert len(got) == len(expected) == len(names)
    for name, a, b in zip(names, got, expected):
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} against {tuple(b.shape)}"
        if b.is_floating_point():
            torch.testing.assert_close(a, b, rtol=rtol, atol=TOLERANCE, msg=lambda m: f"{name}: {m}")
        else:
            assert torch.equal(a.to(b.dtype), b), f"{name} differs"


NEAR_TIE = 1e-6  # scores this close may come out of onnxruntime in either order (float rounding of a near-tie)


def assert_detections_close(got: list[torch.Tensor], expected: tuple[torch.Tensor, ...], rtol: float = 0.0) -> None:
    """Detections ``(boxes, scores, labels)`` from onnxruntime against eager ones, in order up to near-ties: the scores,
    best first, within ``TOLERANCE``, and each eager detection found at a position of the same score (within
    ``NEAR_TIE``) with its label and box (within ``TOLERANCE`` plus ``rtol`` of its coordinates); the last one may have
    given way to a candidate of a near-tied score."""
    (got_boxes, got_scores, got_labels), (boxes, scores, labels) = got, expected
    torch.testing.assert_close(got_scores, scores, rtol=0, atol=TOLERANCE, msg=lambda m: f"scores: {m}")
    for b in range(len(scores)):
        last = scores[b, -1]
        for i in range(scores.shape[1]):
            same_score = (scores[b] - scores[b, i]).abs() <= NEAR_TIE
            box_tolerance = TOLERANCE + rtol * boxes[b, i].abs()
            found = (
                same_score
                & (got_labels[b] == labels[b, i])
                & ((got_boxes[b] - boxes[b, i]).abs() <= box_tolerance).all(-1)
            )
            assert found.any() or (scores[b, i] - last).abs() <= NEAR_TIE, (
                f"detection {i} of image {b} is not in onnxruntime's"
            )


def eager_reference(module: torch.nn.Module, model: Any, images: torch.Tensor) -> dict[str, Any]:
    """What the task's own eager code gives for ``images`` in [0, 1], per image, at the input size."""
    normalized = normalize(images, list(IMAGENET_MEAN), list(IMAGENET_STD))  # the data pipeline's, not the export's
    sizes = torch.tensor([images.shape[-2:]] * len(images))
    with torch.no_grad():
        if "top_labels" in model.output_names:
            return {"probabilities": module(normalized).softmax(-1)}
        if "probabilities" in model.output_names:
            return {"probabilities": module(normalized)}
        outputs = module.model(normalized)
        if "segment_ids" in model.output_names:
            return {"panoptic": module.model.postprocess_panoptic(outputs, sizes, sizes, IS_THING)}
        return {"detections": module.model.postprocess(outputs, sizes)}


def assert_eager_postprocessing(
    module: torch.nn.Module, model: Any, images: torch.Tensor, ours: tuple[torch.Tensor, ...]
) -> None:
    """The exportable wrapper's outputs ``ours`` against the task's eager post-processing, image by image."""
    reference = eager_reference(module, model, images)
    named = dict(zip(model.output_names, ours))
    if "probabilities" in reference:
        torch.testing.assert_close(named["probabilities"], reference["probabilities"], rtol=0, atol=1e-6)
        return
    if "panoptic" in reference:
        for b, expected in enumerate(reference["panoptic"]):
            assert torch.equal(named["segment_ids"][b], expected["segment_ids"])
            count = len(expected["segments_info"])
            assert named["segment_labels"][b, :count].tolist() == [
                info["category_id"] for info in expected["segments_info"]
            ]
            assert (named["segment_labels"][b, count:] == -1).all()
            torch.testing.assert_close(
                named["segment_scores"][b, :count], torch.tensor([info["score"] for info in expected["segments_info"]])
            )
        return
    for b, expected in enumerate(reference["detections"]):
        count = len(expected["scores"])
        for key, value in expected.items():  # Mask2Former's instance boxes are its masks' (not exported)
            if key in named:
                assert torch.equal(named[key][b, :count], value), f"{key} of image {b}"
        if "labels" in named and count < named["labels"].shape[1]:
            assert (named["labels"][b, count:] == -1).all() and (named["scores"][b, count:] == 0).all()


# (config, init_args overriding it, image size, a second image size; None: Swin, whose ONNX export has a fixed
# size): every config family's model, toy-sized.
CASES = {
    "classification_toy": ({}, (64, 96), (88, 72)),
    # the other backbone families, narrow and shallow (NAT, ViT/DeiT and Mixer fix their size at export)
    "nat_tiny_imagenet": (
        {"backbone_kwargs": {"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 2, 2, 2], "kernel_size": 3}},
        (96, 128),
        None,
    ),
    "deit_small_imagenet": (
        {"backbone_kwargs": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 64}},
        (64, 64),
        None,
    ),
    "mixer_b16_imagenet": ({"backbone_kwargs": {"embed_dim": 32, "depth": 2, "img_size": 64}}, (64, 64), None),
    "detr_r50": ({"detector": "detr_toy"}, (96, 128), (112, 84)),
    "detr_swin_toy": ({}, (96, 128), None),
    "dino_swin_toy": ({"class_scale": 1.0}, (96, 128), None),
    # its 100 queries' 300 best (query, class) pairs end in near-tied scores that float rounding reorders: the 100 best
    "rtdetr_convnext_toy": (
        {"class_scale": 1.0, "detector_kwargs": {**detector_kwargs("rtdetr_convnext_toy"), "num_detections": 100}},
        (96, 128),
        (112, 84),
    ),
    # RT-DETR's encoder and backbone: their dynamic size is rtdetr_convnext_toy's case; a fixed size exports faster
    "dfine_convnext_toy": (
        {"class_scale": 1.0, "detector_kwargs": {**detector_kwargs("dfine_convnext_toy"), "num_detections": 100}},
        (96, 128),
        None,
    ),
    "upernet_swin_t_ade20k": (
        {"backbone": "swin_toy", "backbone_kwargs": None, "head_kwargs": {"channels": 32, "aux_channels": 16}},
        (128, 96),
        None,
    ),
    "upernet_deit_s_ade20k": (
        {
            "backbone_kwargs": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 64, "pyramid_channels": 32},
            "head_kwargs": {"channels": 32, "aux_channels": 16},
        },
        (64, 64),
        None,
    ),  # ViT's simple pyramid
    "mask2former_swin_toy_ade20k": ({}, (96, 128), None),
    "mask2former_swin_toy_coco_instance": ({}, (96, 128), None),
    "mask2former_swin_toy_coco_panoptic": ({}, (128, 96), None),
    # perturbed DETR's queries come out alike (masks equal to 1e-3): they all pick stuff class 3, one segment; the
    # segment rules are tested on hand-built outputs
    # (test_exported_detr_panoptic_drops_small_segments_as_the_eager_loop)
    "detr_panoptic_swin_toy": ({}, (96, 128), None),
}


@pytest.mark.parametrize("config", list(CASES))
def test_exported_model_in_onnxruntime_gives_the_eager_outputs(config: str, tmp_path: Path) -> None:
    """One export per model (traced at batch 3), run at batches 1 and 2 (two different images), and at a second image
    size where the size is dynamic; a Swin model's fixed-size export refuses another size (onnxruntime: invalid
    dimensions)."""
    init_args, size, second_size = CASES[config]
    module = build_task(config, **init_args)
    model = deployable(module, config, IS_THING)
    dynamic = second_size is not None
    info = export(model, tmp_path / f"{config}.onnx", "onnx", example_images(size, 3), dynamic_size=dynamic)
    assert info["dims"] == {
        "batch": None,
        "height": None if dynamic else size[0],
        "width": None if dynamic else size[1],
    }
    for batch, image_size in [(1, size), (2, size), *([(2, second_size)] if dynamic else [])]:
        images = example_images(image_size, batch, seed=batch + 10)
        with torch.no_grad():
            ours = model(images)
        assert_eager_postprocessing(module, model, images, ours)
        if is_sigmoid(model):  # hundreds of (query, class) pairs: near-tied scores
            assert_detections_close(run_onnx(info["path"], images), ours)
        else:
            assert_outputs_close(run_onnx(info["path"], images), ours, model.output_names)
    if not dynamic:
        with pytest.raises(Exception, match="invalid dimensions for input: images"):
            run_onnx(info["path"], example_images((size[0] + 32, size[1]), 1))


def is_sigmoid(model: Any) -> bool:
    """Whether ``model`` exports a sigmoid detector's (query, class) pairs (DINO, RT-DETR, D-FINE)."""
    from vision_tx.models.query_detector import DeformableQueryDetector

    return isinstance(model, DetectionExport) and isinstance(model.network, DeformableQueryDetector)


def test_swin_models_refuse_a_dynamic_image_size_in_onnx_in_one_line(tmp_path: Path) -> None:
    model = deployable(build_task("detr_swin_toy"), "detr_swin_toy")
    with pytest.raises(ExportError) as raised:
        export(model, tmp_path / "detr.onnx", "onnx", example_images((64, 64)), dynamic_size=True)
    message = str(raised.value)
    assert (
        "\n" not in message
        and message.startswith("detr_swin_toy: no dynamic image size in ONNX for Swin")
        and "aten.remainder" in message
    )


class _DeformableAttention(torch.nn.Module):
    """``ms_deform_attn`` over fixed level shapes (the models' memory)."""

    def __init__(self, shapes: list[tuple[int, int]]) -> None:
        super().__init__()
        self.shapes = shapes

    def forward(self, value: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        from vision_tx.ops import ms_deform_attn

        return ms_deform_attn(value, self.shapes, locations, weights)


class _NeighborhoodAttention(torch.nn.Module):
    """``na2d`` with a relative position bias, kernel 5, dilation 2."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.rpb = torch.nn.Parameter(torch.randn(heads, 9, 9, generator=torch.Generator().manual_seed(0)))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from vision_tx.ops import na2d

        return na2d(q, k, v, kernel_size=5, dilation=2, rpb=self.rpb)


def onnx_session(module: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> Any:
    """``module`` exported to ONNX on ``example`` (inputs ``input0``, ...; first dimensions dynamic), as an onnxruntime
    session."""
    onnxruntime = require_reference("onnxruntime")
    program = torch.export.export(module, example, dynamic_shapes=tuple({0: torch.export.Dim.AUTO} for _ in example))
    torch.onnx.export(
        program, example, str(path), input_names=[f"input{i}" for i in range(len(example))], dynamo=True, optimize=False
    )
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_session(session: Any, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The first output of ``session`` for ``inputs``."""
    return torch.from_numpy(session.run(None, {f"input{i}": x.numpy() for i, x in enumerate(inputs)})[0])


@pytest.mark.parametrize("shapes", [[(12, 16), (6, 8), (3, 4)], [(9, 7), (5, 4)]])
def test_ms_deform_attn_exports(shapes: list[tuple[int, int]], tmp_path: Path) -> None:
    """Sampling points inside, on the border and outside every level; two pyramids, two batch sizes."""
    generator = torch.Generator().manual_seed(len(shapes))
    heads, head_dim, points, queries, tokens = 2, 8, 3, 5, sum(h * w for h, w in shapes)

    def inputs(batch: int) -> tuple[torch.Tensor, ...]:
        return (
            torch.randn(batch, tokens, heads, head_dim, generator=generator),
            torch.rand(batch, queries, heads, len(shapes), points, 2, generator=generator) * 1.4 - 0.2,
            torch.rand(batch, queries, heads, len(shapes), points, generator=generator),
        )

    module = _DeformableAttention(shapes)
    session = onnx_session(module, inputs(2), tmp_path / "ms_deform_attn.onnx")
    # one gather and one sum: ONNX's translation of embedding_bag loops over the samples (minutes at COCO sizes)
    operators = {
        node.op_type for node in require_reference("onnx").load(str(tmp_path / "ms_deform_attn.onnx")).graph.node
    }
    assert "Loop" not in operators and {"Gather", "ReduceSum"} <= operators
    for batch in (1, 3):
        given = inputs(batch)
        torch.testing.assert_close(run_session(session, given), module(*given), rtol=0, atol=1e-5)


@pytest.mark.parametrize("size", [(14, 14), (11, 17)])
def test_na2d_exports(size: tuple[int, int], tmp_path: Path) -> None:
    """Kernel 5, dilation 2, a relative position bias; two map sizes (its tiling is planned per size), two batch
    sizes."""
    generator = torch.Generator().manual_seed(size[1])
    module = _NeighborhoodAttention(heads=2)

    def inputs(batch: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(batch, *size, 2, 8, generator=generator) for _ in range(3))

    session = onnx_session(module, inputs(2), tmp_path / "na2d.onnx")
    for batch in (1, 3):
        given = inputs(batch)
        with torch.no_grad():
            torch.testing.assert_close(run_session(session, given), module(*given), rtol=0, atol=1e-5)


class _FixedPanoptic(torch.nn.Module):
    """A DETR panoptic stand-in whose outputs are the given ``pred_logits`` and ``pred_masks`` for any images."""

    def __init__(self, outputs: dict[str, torch.Tensor], min_area: int) -> None:
        super().__init__()
        self.logits, self.masks = torch.nn.Parameter(outputs["pred_logits"]), torch.nn.Parameter(outputs["pred_masks"])
        self.num_classes = self.logits.shape[-1] - 1
        self.postprocess_kwargs = {"min_area": min_area}

    def panoptic_segments(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """DETR panoptic's own (it reads ``postprocess_kwargs``)."""
        from vision_tx.models import DETRPanoptic

        return DETRPanoptic.panoptic_segments(self, *args)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        tie = 0 * images.mean()
        return {"pred_logits": self.logits + tie, "pred_masks": self.masks + tie}


@pytest.mark.parametrize("min_area", [4, 64])
def test_exported_detr_panoptic_drops_small_segments_as_the_eager_loop(min_area: int, tmp_path: Path) -> None:
    """tests/heads/test_detr_postprocess.py's hand-built outputs on a 12x16 image: stuff queries 1 and 2 merge, thing
    query 3 lies on the padding (area 0: dropped, its number freed); at ``min_area`` 64 thing query 0 (64 pixels) is
    dropped too and the stuff segment takes its pixels. Exported, in onnxruntime, against ``postprocess_panoptic``."""
    from tests.heads.test_detr_postprocess import IS_THING as CATEGORIES
    from tests.heads.test_detr_postprocess import panoptic_outputs
    from vision_tx.export import PanopticExport
    from vision_tx.heads.detr.postprocess import postprocess_panoptic

    network = _FixedPanoptic(panoptic_outputs(), min_area)
    model = PanopticExport(network, "fixed", CATEGORIES).eval()
    images = example_images((12, 16), 1)
    info = export(model, tmp_path / "fixed.onnx", "onnx", images, dynamic_size=False, dynamic_batch=False)
    sizes = torch.tensor([[12, 16]])
    (expected,) = postprocess_panoptic(network(images), sizes, sizes, CATEGORIES, min_area=min_area)
    assert [info["category_id"] for info in expected["segments_info"]] == ([1, 5] if min_area == 4 else [5])
    segment_ids, labels, scores = run_onnx(info["path"], images)
    assert torch.equal(segment_ids[0], expected["segment_ids"])
    count = len(expected["segments_info"])
    assert (
        labels[0, :count].tolist() == [info["category_id"] for info in expected["segments_info"]]
        and (labels[0, count:] == -1).all()
    )
    torch.testing.assert_close(scores[0, :count], torch.tensor([info["score"] for info in expected["segments_info"]]))


def test_the_tool_needs_a_config_and_names_its_formats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--ckpt", "x.ckpt", "--out", "x.onnx"])
    assert "--config is required" in capsys.readouterr().err
    assert FORMATS == ("onnx", "exported_program")


def test_exported_program_format_loads_and_gives_the_eager_outputs(tmp_path: Path) -> None:
    """``--format exported_program``: ``torch.export.save``'s file, loaded back, at another batch size."""
    module = build_task("classification_toy")
    model = deployable(module, "classification_toy")
    info = export(model, tmp_path / "classifier.pt2", "exported_program", example_images((64, 64)), dynamic_size=False)
    images = example_images((64, 64), 3, seed=3)
    with torch.no_grad():
        assert_outputs_close(list(torch.export.load(info["path"]).module()(images)), model(images), model.output_names)


class _FixedDetector(torch.nn.Module):
    """A detector whose ``pred_logits [1,Q,C']`` and ``pred_boxes [1,Q,4]`` are given (tied to the input by
    ``+ 0 * images.mean()``, so the export keeps them a computation): the post-processing's own test bench."""

    detection_outputs = ("boxes", "scores", "labels")

    def __init__(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        nms_threshold: float | None = None,
        share_scores: bool = False,
        softmax: bool = False,
    ) -> None:
        super().__init__()
        self.logits, self.boxes = torch.nn.Parameter(logits), torch.nn.Parameter(boxes)
        self.num_detections, self.nms_threshold, self.share_scores = logits.shape[1], nms_threshold, share_scores
        self.softmax = softmax  # DETR's post-processing, else the sigmoid detectors'

    def detections(self, outputs: dict[str, torch.Tensor], image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        """The detectors' own batch post-processing (DETR's or the sigmoid detectors')."""
        from vision_tx.models import DETR
        from vision_tx.models.query_detector import DeformableQueryDetector

        return (DETR if self.softmax else DeformableQueryDetector).detections(self, outputs, image_sizes)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        tie = 0 * images.mean()
        return {
            "pred_logits": self.logits.expand(len(images), -1, -1) + tie,
            "pred_boxes": self.boxes.expand(len(images), -1, -1) + tie,
        }


def exported_detections(
    network: _FixedDetector, tmp_path: Path
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """``network`` behind its post-processing, exported and run in onnxruntime on one 32x48 image; and
    its eager post-processing (``postprocess_detections`` or ``postprocess_sigmoid_detections``) for that image."""
    from vision_tx.heads.detr.postprocess import postprocess_detections, postprocess_sigmoid_detections

    model = DetectionExport(network, "fixed").eval()
    images = example_images((32, 48), 1)
    info = export(model, tmp_path / "fixed.onnx", "onnx", images, dynamic_size=False, dynamic_batch=False)
    outputs, sizes = network(images), torch.tensor([[32, 48]])
    if network.nms_threshold is None and network.softmax:
        return run_onnx(info["path"], images), postprocess_detections(outputs, sizes)
    eager = postprocess_sigmoid_detections(
        outputs, sizes, network.num_detections, network.nms_threshold, network.share_scores
    )
    return run_onnx(info["path"], images), eager


def test_exported_nms_keeps_the_better_of_two_overlapping_boxes_of_a_class(tmp_path: Path) -> None:
    """Query 0 (score 0.9) and 1 (0.6) overlap (IoU 0.8) in class 0: 1 is suppressed; query 2 overlaps 0 as much but
    in class 1 and stays; query 3 lies apart. Against torchvision's ``batched_nms`` (the eager post-processing)."""
    boxes = torch.tensor(
        [[[0.50, 0.50, 0.40, 0.40], [0.52, 0.50, 0.40, 0.40], [0.50, 0.52, 0.40, 0.40], [0.15, 0.15, 0.1, 0.1]]]
    )
    probabilities = torch.tensor([[[0.9, 0.01], [0.6, 0.02], [0.03, 0.7], [0.5, 0.04]]])
    network = _FixedDetector(probabilities.logit(), boxes, nms_threshold=0.5)
    (got_boxes, got_scores, got_labels), [expected] = exported_detections(network, tmp_path)
    kept = len(expected["scores"])
    assert kept < 8 and [round(s, 2) for s in expected["scores"].tolist()[:4]] == [0.9, 0.7, 0.5, 0.04]
    assert got_labels[0, :kept].tolist() == expected["labels"].tolist() and (got_labels[0, kept:] == -1).all()
    torch.testing.assert_close(got_scores[0, :kept], expected["scores"], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(got_boxes[0, :kept], expected["boxes"], rtol=0, atol=TOLERANCE)


def test_exported_shared_scores_are_the_eager_ones(tmp_path: Path) -> None:
    """``share_scores``: query 1 is torn between classes 0 and 1 (0.8, 0.7), so its class 0 falls below query 2's
    surer 0.6 (0.8 * 0.8 / 1.5 = 0.43 against 0.6 * 0.6 / 0.61 = 0.59); the exported order and scores are the eager
    ones."""
    boxes = torch.tensor([[[0.2, 0.2, 0.1, 0.1], [0.5, 0.5, 0.1, 0.1], [0.8, 0.8, 0.1, 0.1]]])
    probabilities = torch.tensor([[[0.01, 0.02], [0.8, 0.7], [0.6, 0.01]]])
    network = _FixedDetector(probabilities.logit(), boxes, nms_threshold=0.5, share_scores=True)
    (got_boxes, got_scores, got_labels), [expected] = exported_detections(network, tmp_path)
    assert [round(s, 2) for s in expected["scores"].tolist()[:3]] == [0.59, 0.43, 0.33]
    kept = len(expected["scores"])
    assert got_labels[0, :kept].tolist() == expected["labels"].tolist()
    torch.testing.assert_close(got_scores[0, :kept], expected["scores"], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(got_boxes[0, :kept], expected["boxes"], rtol=0, atol=TOLERANCE)


def test_exported_detr_never_labels_a_query_no_object(tmp_path: Path) -> None:
    """Queries 0 and 2 give the no-object class (last) the largest logit: they still report their best real class
    and its probability (``postprocess_detections``), never the no-object class or its probability."""
    logits = torch.tensor([[[1.0, 0.5, 0.2, 4.0], [3.0, 0.1, 0.2, 0.5], [0.1, 0.9, 0.3, 5.0], [0.2, 0.1, 2.5, 1.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2]]]).expand(1, 4, 4).clone()
    (_, got_scores, got_labels), [expected] = exported_detections(_FixedDetector(logits, boxes, softmax=True), tmp_path)
    assert expected["labels"].tolist() == [0, 0, 1, 2] == got_labels[0].tolist()
    torch.testing.assert_close(got_scores[0], expected["scores"], rtol=0, atol=TOLERANCE)
    assert got_scores[0, 0] < 0.1 < got_scores[0, 1]

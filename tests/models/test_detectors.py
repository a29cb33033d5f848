"""Every detector of ``DETECTORS`` answers the protocol of docs/CONVENTIONS.md ("Detectors") the way
``DetectionModule``, the attention pictures and the converter call it: named sizes (the official one and
``<name>_toy``, which the tests here build), built from ``matcher_kwargs`` and ``criterion_kwargs``, targets as
the data pipeline gives them, per-query post-processing in query order, cross-attention maps beside the outputs,
``for_conversion`` and native keys through ``convert_state_dict``."""

from __future__ import annotations

import inspect

import pytest
import torch
from torchvision.ops import box_convert

from vision_tx.backbones import build_backbone
from vision_tx.models import DETECTORS, named_sizes
from vision_tx.models.query_detector import DeformableQueryDetector

SWIN = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
# The official sizes' names (the constructors' defaults); a new detector fails here until it has a ``_toy`` size.
OFFICIAL = [name for name, build in DETECTORS.items() if not build.keywords]
# The matching costs that all at 0 leave nothing to match, and a loss weight with the terms it scales.
BOX_COSTS = {"cost_class": 0.0, "cost_bbox": 0.0, "cost_giou": 0.0}
ZERO_COSTS = {name: BOX_COSTS for name in OFFICIAL} | {
    "mask2former": {"cost_class": 0.0, "cost_mask": 0.0, "cost_dice": 0.0}
}
WEIGHTED = {name: ("weight_bbox", "loss_bbox") for name in OFFICIAL} | {"mask2former": ("weight_mask", "loss_mask")}
# Mask2Former's matcher takes its costs from the criterion's weights unless given: the paper's, fixed, so that
# both weights match the same pairs.
FIXED_MATCHER = {"mask2former": {"cost_class": 2.0, "cost_mask": 5.0, "cost_dice": 5.0}}
NUM_CLASSES = 5
SIZES = torch.tensor([[64, 96], [48, 80]])  # the unpadded (h, w) of each image of the batch


def build(name: str, **kwargs) -> torch.nn.Module:
    """``name``'s toy size on a small Swin."""
    torch.manual_seed(0)
    toy = DETECTORS[f"{name}_toy"]
    return toy(build_backbone("swin_t", out_indices=toy.func.backbone_out_indices, **SWIN), NUM_CLASSES, **kwargs)


def batch() -> tuple[torch.Tensor, torch.Tensor, list[dict], list[dict]]:
    """Images, padding and the same targets twice: as the data pipeline gives them (absolute xyxy, ``size``) and
    normalised."""
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 64, 96, generator=generator)
    pixel_mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    pixel_mask[1, 48:], pixel_mask[1, :, 80:] = True, True
    normalised = [
        {"labels": torch.tensor([1, 4]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3], [0.3, 0.6, 0.2, 0.2]])},
        {"labels": torch.tensor([2]), "boxes": torch.tensor([[0.45, 0.55, 0.25, 0.35]])},
    ]
    pipeline = []
    for index, (target, size) in enumerate(zip(normalised, SIZES)):
        height, width = size.tolist()
        boxes = box_convert(target["boxes"], "cxcywh", "xyxy") * torch.tensor([width, height, width, height])
        # Instance targets add a mask per object (here its box filled), read by the segmenting detectors.
        rows, columns = torch.arange(height)[:, None] + 0.5, torch.arange(width) + 0.5
        masks = torch.stack(
            [(columns > x0) & (columns < x1) & (rows > y0) & (rows < y1) for x0, y0, x1, y1 in boxes.tolist()]
        )
        target["masks"] = masks
        pipeline.append(
            {
                "labels": target["labels"],
                "boxes": boxes,
                "masks": masks,
                "image_id": index,
                "size": size,
                "orig_size": size * 2,
            }
        )
    return images, pixel_mask, pipeline, normalised


@pytest.mark.parametrize("name", OFFICIAL)
def test_class_attributes_and_kwargs_reach_the_matcher_and_criterion(name: str) -> None:
    cls = DETECTORS[name].func
    assert isinstance(cls.backbone_out_indices, tuple) and 0 < cls.score_threshold < 1
    assert set(cls.variants) == {name, f"{name}_toy"} and DETECTORS[f"{name}_toy"].func is cls
    with pytest.raises(ValueError, match="all matching costs are 0"):
        build(name, matcher_kwargs=ZERO_COSTS[name])
    images, pixel_mask, targets, _ = batch()
    totals, terms = [], None
    weight_name, term = WEIGHTED[name]
    for weight in (5.0, 7.0):
        model = build(name, criterion_kwargs={weight_name: weight}, matcher_kwargs=FIXED_MATCHER.get(name)).eval()
        torch.manual_seed(2)  # the same sampled points (mask losses)
        with torch.no_grad():
            losses = model.loss(model(images, pixel_mask), targets)
        totals.append(losses["loss"])
        terms = sum(value for key, value in losses.items() if key.startswith(term))
    torch.testing.assert_close(totals[1] - totals[0], 2.0 * terms, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", OFFICIAL)
def test_training_reads_the_pipelines_targets(name: str) -> None:
    """The training forward (denoising queries) and the loss give the same on pipeline and on normalised targets."""
    model = build(name).train()
    images, pixel_mask, pipeline, normalised = batch()
    losses = []
    for targets in (pipeline, normalised):
        torch.manual_seed(2)
        with torch.no_grad():
            losses.append(model.loss(model(images, pixel_mask, targets), targets))
    assert set(losses[0]) == set(losses[1])
    for key in losses[0]:
        # Float32 rounding of the boxes' round trip through pixels: measured within 4.8e-7 of each term.
        torch.testing.assert_close(losses[0][key], losses[1][key], rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", OFFICIAL)
def test_postprocessing_and_cross_attention(name: str) -> None:
    model = build(name).eval()
    images, pixel_mask, _, _ = batch()
    with torch.no_grad():
        outputs = model(images, pixel_mask)
    queries = outputs["pred_logits"].shape[1]
    detections = model.postprocess(outputs, SIZES)
    # A segmenting detector adds its instances' masks.
    assert len(detections) == 2 and all(
        {"scores", "labels", "boxes"} <= set(d) <= {"scores", "labels", "boxes", "masks"} for d in detections
    )
    per_query = model.postprocess_per_query(outputs, SIZES)
    for image, (detection, size) in enumerate(zip(per_query, SIZES)):
        height, width = size.tolist()
        assert detection["scores"].shape == (queries,) and detection["boxes"].shape == (queries, 4)
        if "pred_boxes" in outputs:
            expected = box_convert(outputs["pred_boxes"][image], "cxcywh", "xyxy") * torch.tensor(
                [width, height, width, height]
            )
            torch.testing.assert_close(detection["boxes"], expected, rtol=0, atol=1e-4)  # in query order
        else:  # a segmenting detector: each query's best real class of its softmax, in query order
            best = outputs["pred_logits"][image].softmax(-1)[:, :-1].max(-1)
            torch.testing.assert_close(
                (detection["scores"], detection["labels"]), (best.values, best.indices), rtol=0, atol=0
            )
    result = model.cross_attention(images, pixel_mask)
    # DETR records its attention through the weights path: measured within 1.8e-7.
    torch.testing.assert_close(result["outputs"]["pred_logits"], outputs["pred_logits"], rtol=0, atol=1e-6)
    attention = result["attention"]
    assert attention.dim() == 4 and attention.shape[:2] == (2, queries) and (attention >= 0).all()


@pytest.mark.parametrize("name", OFFICIAL)
def test_postprocess_is_the_per_image_cut_of_the_batch_detections(name: str) -> None:
    """``detections`` (what export traces) holds ``detection_outputs`` as ``[B,N,...]`` tensors; ``postprocess`` gives
    each image's leading rows of it, and any rows past them are padding (label -1, score 0)."""
    model = build(
        name, **({"nms_threshold": 0.5} if issubclass(DETECTORS[name].func, DeformableQueryDetector) else {})
    ).eval()
    images = batch()[0]
    sizes = torch.tensor([list(images.shape[-2:])] * len(images))  # unpadded: every image at the input size
    with torch.no_grad():
        outputs = model(images)
        detections = model.detections(outputs, sizes)
        per_image = model.postprocess(outputs, sizes)
    assert tuple(detections) == tuple(model.detection_outputs)
    for image, found in enumerate(per_image):
        count = len(found["scores"])
        for key, value in detections.items():
            assert value.shape[0] == len(images) and torch.equal(value[image, :count], found[key]), key
        assert (detections["labels"][image, count:] == -1).all() and (detections["scores"][image, count:] == 0).all()


@pytest.mark.parametrize(
    "name", [name for name in OFFICIAL if issubclass(DETECTORS[name].func, DeformableQueryDetector)]
)
def test_share_scores_reach_the_post_processing(name: str) -> None:
    """The sigmoid detectors' ``share_scores``: both post-processings score as
    :func:`~vision_tx.heads.detr.postprocess.sigmoid_scores` does with it."""
    from vision_tx.heads.detr.postprocess import sigmoid_scores

    model = build(name, share_scores=True).eval()
    images, pixel_mask, _, _ = batch()
    with torch.no_grad():
        outputs = model(images, pixel_mask)
    expected = sigmoid_scores(outputs["pred_logits"], share_scores=True)
    detections, per_query = model.postprocess(outputs, SIZES), model.postprocess_per_query(outputs, SIZES)
    for image in range(len(SIZES)):
        torch.testing.assert_close(per_query[image]["scores"], expected[image].max(-1).values)
        assert detections[image]["scores"][0] == expected[image].max()


@pytest.mark.parametrize("name", OFFICIAL)
def test_for_conversion_and_native_keys_pass(name: str) -> None:
    cls = DETECTORS[name].func
    with torch.device("meta"):
        model = cls.for_conversion("resnet50")
        small = cls.for_conversion("resnet50", 7)
    assert type(model) is cls and small.num_classes == 7
    state = model.state_dict()
    assert set(model.convert_state_dict(state)) == set(state)


def test_named_sizes_build_their_size_and_build_time_kwargs_win() -> None:
    with torch.device("meta"):
        backbone = build_backbone("swin_t", out_indices=(1, 2, 3), **SWIN)
        toy = DETECTORS["rtdetr_toy"](backbone, NUM_CLASSES)
        fewer = DETECTORS["rtdetr_toy"](backbone, NUM_CLASSES, num_queries=7)
        official = DETECTORS["rtdetr"](backbone, NUM_CLASSES)
    assert (toy.num_queries, toy.enc_output.in_features, len(toy.decoder.layers)) == (30, 64, 3)
    assert (fewer.num_queries, fewer.enc_output.in_features) == (7, 64)
    assert (official.num_queries, official.enc_output.in_features, len(official.decoder.layers)) == (300, 256, 6)
    with pytest.raises(ValueError, match="RTDETR registers 'rtdetr', which RTDETR has"):
        named_sizes(DETECTORS["rtdetr"].func, DETECTORS["rtdetr"].func)


@pytest.mark.parametrize("name", [name for name in OFFICIAL if hasattr(DETECTORS[name].func, "build")])
def test_composed_detectors_take_their_parts_by_keyword_and_build_the_same_twice(name: str) -> None:
    """A detector composed from its parts (docs/CONVENTIONS.md, "Detectors"): its constructor takes the parts and
    settings by keyword only, its builder makes them from a size, and two builds from the same seed are equal (one
    state: nothing depends on what was built before)."""
    cls = DETECTORS[name].func
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert parameters and all(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in parameters)
    assert {"backbone", "decoder", "heads", "denoising", "criterion"} <= {p.name for p in parameters}
    with pytest.raises(TypeError):
        cls(build_backbone("swin_t", out_indices=cls.backbone_out_indices, **SWIN), NUM_CLASSES)
    first, second = build(name).state_dict(), build(name).state_dict()
    assert list(first) == list(second) and all(torch.equal(first[key], second[key]) for key in first)

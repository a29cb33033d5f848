"""DINO against transformers' DeformableDetrForObjectDetection (two-stage, box refinement) on the same
backbone maps and weights, and the contract of its contrastive denoising."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import require_reference
from tests.models.detr_helpers import padded_batch
from tests.parity import perturb_
from vision_tx.heads.detr import HungarianMatcher
from vision_tx.heads.dino import DINOCriterion
from vision_tx.models import DINO
from vision_tx.models.query_detector import QueryHeads, proposal_anchors

transformers = require_reference("transformers")
_detr_loss = require_reference("transformers.loss.loss_deformable_detr")
DeformableDetrImageLoss, DeformableDetrHungarianMatcher = (
    _detr_loss.DeformableDetrImageLoss,
    _detr_loss.DeformableDetrHungarianMatcher,
)

NUM_CLASSES, DIM, QUERIES, LAYERS = 7, 64, 12, 2
CHANNELS = (16, 32, 64)  # the stride 8, 16, 32 maps
IMAGE_SIZE = (80, 112)

# vision_tx name -> transformers name, applied in order (self-attention q/k/v rows are split separately).
_TO_TRANSFORMERS = [
    (r"^neck\.input_proj\.", "model.input_proj."),
    (r"^neck\.level_embed$", "model.level_embed"),
    (r"^(encoder|decoder)\.", r"model.\1."),
    (r"^(enc_output|enc_output_norm|pos_trans|pos_trans_norm)\.", r"model.\1."),
    (r"\.ffn\.linear(\d)\.", r".mlp.fc\1."),
    (r"\.ffn\.norm\.", ".final_layer_norm."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.encoder_attn_layer_norm."),
    (r"\.norm1\.", ".self_attn_layer_norm."),
]


def to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    converted = {}
    for key, value in state.items():
        for pattern, replacement in _TO_TRANSFORMERS:
            key = re.sub(pattern, replacement, key)
        if key.endswith(("in_proj_weight", "in_proj_bias")):
            prefix, kind = key.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                converted[f"{prefix}.{name}.{kind}"] = part
        elif key.startswith(("class_embed.", "bbox_embed.")):  # tied to the decoder's copies
            converted[key] = converted[f"model.decoder.{key}"] = value
        else:
            converted[key] = value
    return converted


class MapsBackbone(nn.Module):
    """Returns the given maps whatever the images: both models read the same backbone features, taken as the
    stride 8, 16, 32, ... maps."""

    def __init__(self, maps: list[torch.Tensor]) -> None:
        super().__init__()
        self.maps = maps
        self.out_channels = [m.shape[1] for m in maps]
        self.strides = [8 * 2**i for i in range(len(maps))]

    def forward(self, images: torch.Tensor) -> OrderedDict:
        return OrderedDict((f"res{i + 3}", m) for i, m in enumerate(self.maps))


# Deformable DETR's settings where DINO's differ (position encoding, decoder norm, inverse-sigmoid bound).
DEFORMABLE_DETR = dict(
    query_selection="two_stage",
    num_denoising=0,
    position_temperature=10000.0,
    position_offset=-0.5,
    decoder_norm=False,
    inverse_sigmoid_eps=1e-5,
)


def tiny_dino(maps: list[torch.Tensor], **overrides) -> DINO:
    kwargs = dict(
        num_queries=QUERIES,
        hidden_dim=DIM,
        num_heads=4,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        dim_feedforward=96,
        num_points=3,
        **DEFORMABLE_DETR,
    )
    return DINO.build(MapsBackbone(maps), NUM_CLASSES, **{**kwargs, **overrides})


@pytest.fixture(scope="module")
def batch():
    images, pixel_mask, targets = padded_batch(IMAGE_SIZE, (56, 72), (3, 2), NUM_CLASSES)
    generator = torch.Generator().manual_seed(3)
    maps = []
    for stride, channels in zip((8, 16, 32), CHANNELS):
        maps.append(torch.randn(2, channels, IMAGE_SIZE[0] // stride, IMAGE_SIZE[1] // stride, generator=generator))
    return images, pixel_mask, targets, maps


def ours_and_transformers(maps: list[torch.Tensor]) -> tuple[DINO, nn.Module]:
    """Our two-stage DINO with moved weights, and transformers' DeformableDetr loaded from it (in ``maps``' dtype, eval
    mode)."""
    torch.manual_seed(0)
    ours = tiny_dino(maps).eval()
    perturb_(ours)
    config = transformers.DeformableDetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(
            out_features=["stage2", "stage3", "stage4"],
            hidden_sizes=[8, *CHANNELS],
            embedding_size=8,
            depths=[1, 1, 1, 1],
        ),
        num_labels=NUM_CLASSES,
        d_model=DIM,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        encoder_n_points=3,
        decoder_n_points=3,
        num_queries=QUERIES,
        two_stage_num_proposals=QUERIES,
        two_stage=True,
        with_box_refine=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        auxiliary_loss=True,
        class_cost=2,
    )
    reference = transformers.DeformableDetrForObjectDetection(config).eval()
    state = to_transformers(ours.state_dict())
    backbone_keys = {k for k in reference.state_dict() if k.startswith("model.backbone.")}
    assert set(state) == set(reference.state_dict()) - backbone_keys
    reference.load_state_dict(state, strict=False)

    def backbone_maps(pixel_values, pixel_mask):
        return [(m, F.interpolate(pixel_mask[None].float(), size=m.shape[-2:])[0].bool()) for m in maps]

    reference.model.backbone.forward = backbone_maps
    return ours.to(maps[0].dtype), reference.to(maps[0].dtype)


@pytest.fixture(scope="module")
def models(batch):
    return ours_and_transformers(batch[3])


def transformers_labels(
    targets: list[dict[str, torch.Tensor]], dtype: torch.dtype = torch.float32
) -> list[dict[str, torch.Tensor]]:
    return [{"class_labels": t["labels"], "boxes": t["boxes"].to(dtype)} for t in targets]


def test_outputs_and_loss_match_transformers(models, batch) -> None:
    ours, reference = models
    images, pixel_mask, targets, _ = batch
    with torch.no_grad():
        out = ours(images, pixel_mask)
        ref = reference(images, pixel_mask=(~pixel_mask).long(), labels=transformers_labels(targets))
    torch.testing.assert_close(out["pred_logits"], ref.logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(out["pred_boxes"], ref.pred_boxes, rtol=0, atol=1e-4)
    for layer, aux in enumerate(out["aux_outputs"]):
        torch.testing.assert_close(aux["pred_boxes"], ref.auxiliary_outputs[layer]["pred_boxes"], rtol=0, atol=1e-4)
    assert ref.logits.std() > 0.3 and ref.pred_boxes.std() > 0.05  # not near-constant outputs
    assert (out["pred_boxes"] - out["aux_outputs"][0]["pred_boxes"]).abs().mean() > 0.003  # the last layer refines

    decoder_outputs = {k: v for k, v in out.items() if k != "enc_outputs"}  # transformers leaves the encoder's loss out
    losses = ours.loss(decoder_outputs, targets)
    compared = [k for k in ref.loss_dict if k.startswith("loss_")]
    assert len(compared) == 3 * LAYERS
    for key in compared:
        torch.testing.assert_close(losses[key], ref.loss_dict[key], rtol=0, atol=1e-4, msg=key)
    torch.testing.assert_close(losses["loss"], ref.loss, rtol=0, atol=1e-4)

    # The encoder's proposals (class-agnostic here: two-stage ranks by one objectness logit) are trained
    # against every target as class 0, as Deformable DETR's loss does with its "bin_targets".
    with torch.no_grad():
        losses = ours.loss(out, targets)
        image_loss = DeformableDetrImageLoss(
            DeformableDetrHungarianMatcher(class_cost=2, bbox_cost=5, giou_cost=2), 1, 0.25, ["labels", "boxes"]
        )
        agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
        enc = out["enc_outputs"]
        expected = image_loss(
            {"logits": enc["pred_logits"], "pred_boxes": enc["pred_boxes"]}, transformers_labels(agnostic)
        )
    assert enc["pred_logits"].shape[-1] == 1
    for key in ("loss_ce", "loss_bbox", "loss_giou"):
        torch.testing.assert_close(
            losses[f"{key}_enc"], expected[key], rtol=0, atol=2e-6, msg=key
        )  # measured 0-5e-7 (of ~1)


def test_gradients_match_transformers(batch) -> None:
    """Every parameter's gradient of the decoder layers' weighted loss, in float64 (measured: within
    4e-6 of each parameter's largest gradient; transformers' GIoU differs by 4e-7). Both detach the
    proposals and each layer's input boxes: no box loss reaches the encoder's heads through them."""
    images, pixel_mask, targets, maps = batch
    ours, reference = ours_and_transformers([m.double() for m in maps])
    outputs = ours(images.double(), pixel_mask)
    ours.loss({k: v for k, v in outputs.items() if k != "enc_outputs"}, targets)["loss"].backward()
    reference(
        images.double(), pixel_mask=(~pixel_mask).long(), labels=transformers_labels(targets, torch.float64)
    ).loss.backward()
    untied = lambda name: name.removeprefix("model.decoder.")  # noqa: E731 (the heads are also the decoder's)
    grads = {
        untied(n): g
        for n, g in to_transformers({n: p.grad for n, p in ours.named_parameters() if p.grad is not None}).items()
    }
    expected = {
        untied(n): p.grad for n, p in reference.named_parameters() if p.grad is not None and p.grad.abs().max() > 0
    }
    assert "layers.0.encoder_attn.sampling_offsets.weight" in expected and "model.enc_output.weight" not in expected
    # A key's bias has no gradient (the softmax ignores it) but rounding.
    assert {n for n, g in grads.items() if g.abs().max() > 0 and not n.endswith("k_proj.bias")} <= set(expected)
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-5 * scale + 1e-12, msg=name)


def dino_targets() -> list[dict[str, torch.Tensor]]:
    return [
        {
            "labels": torch.tensor([1, 4, 2]),
            "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1], [0.6, 0.4, 0.3, 0.2]]),
        },
        {"labels": torch.tensor([6]), "boxes": torch.tensor([[0.45, 0.55, 0.25, 0.15]])},
    ]


def test_denoising_positives_lie_within_the_noise_scale_and_negatives_beyond() -> None:
    from vision_tx.heads.dino import ContrastiveDenoising

    torch.manual_seed(0)
    scale = 0.4  # small enough that no noised edge leaves the image (no clamping)
    denoising = ContrastiveDenoising(NUM_CLASSES, DIM, num_queries=60, label_noise_ratio=0.0, box_noise_scale=scale)
    targets = dino_targets()
    queries = denoising(targets, num_matching=QUERIES)
    assert queries.num_groups == 60 // 3 and queries.group_size == 3
    corners = lambda b: torch.cat([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)  # noqa: E731
    for image, target in enumerate(targets):
        count = len(target["labels"])
        half_size = (target["boxes"][:, 2:] / 2).repeat(1, 2)
        for group in range(queries.num_groups):
            start = group * 2 * queries.group_size
            for offset, is_positive in ((0, True), (queries.group_size, False)):
                slots = slice(start + offset, start + offset + count)
                moved = (corners(queries.boxes[image, slots]) - corners(target["boxes"])).abs() / (half_size * scale)
                assert (moved < 1).all() if is_positive else ((moved >= 1) & (moved <= 2 + 1e-5)).all()
                expected = denoising.label_embed(target["labels"])  # no label noise
                torch.testing.assert_close(queries.content[image, slots], expected)
            padding = slice(start + count, start + queries.group_size)
            assert (queries.content[image, padding] == 0).all()
    positives = queries.positive_indices(targets)
    assert positives[1][0].tolist() == [g * 6 for g in range(queries.num_groups)]


def test_label_noise_replaces_about_half_the_ratio() -> None:
    from vision_tx.heads.dino import ContrastiveDenoising

    torch.manual_seed(0)
    denoising = ContrastiveDenoising(1000, 8, num_queries=4000, label_noise_ratio=0.5)
    target = [{"labels": torch.tensor([3]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    queries = denoising(target, num_matching=1)
    kept = (queries.content[0] == denoising.label_embed.weight[3]).all(-1).float().mean()
    assert abs(kept - 0.75) < 0.03  # a quarter replaced (by another class 999 times in 1000)


# IDEA-Research/DINO's config/DINO/DINO_4scale.py (and its position encoding and inverse sigmoid), written
# from that file, with the one override of its training command scripts/DINO_train.sh that the model reads
# (dn_box_noise_scale=1.0; the file's 0.4): the DINO constructor's and criterion's defaults must be these numbers.
DINO_4SCALE = dict(
    num_queries=900,
    hidden_dim=256,
    num_heads=8,
    num_encoder_layers=6,
    num_decoder_layers=6,
    dim_feedforward=2048,
    dropout=0.0,
    num_levels=4,
    num_points=4,
    query_selection="mixed",
    num_denoising=100,
    label_noise_ratio=0.5,
    box_noise_scale=1.0,
    position_temperature=20.0,
    position_offset=0.0,
    decoder_norm=True,
    inverse_sigmoid_eps=1e-3,
    num_detections=300,  # num_select, the boxes PostProcess keeps
)
DINO_OWN = dict(
    nms_threshold=None, share_scores=False, exact_valid_ratios=False
)  # vision_tx's options, no official counterpart (off: the official behaviour)
DINO_4SCALE_LOSS = dict(weight_ce=1.0, weight_bbox=5.0, weight_giou=2.0, focal_alpha=0.25, focal_gamma=2.0)
DINO_4SCALE_MATCHER = dict(cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal_alpha=0.25, focal_gamma=2.0)


def test_defaults_are_the_official_dino_4scale_config() -> None:
    from vision_tx.heads.dino import ContrastiveDenoising

    defaults = {
        k: p.default
        for k, p in inspect.signature(DINO.build).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert {k: defaults[k] for k in DINO_4SCALE} == DINO_4SCALE
    assert {k: defaults[k] for k in DINO_OWN} == DINO_OWN
    assert defaults["look_forward_twice"] is True
    assert set(defaults) == {
        *DINO_4SCALE,
        *DINO_OWN,
        "look_forward_twice",
        "matcher_kwargs",
        "criterion_kwargs",
    }  # each has its row
    denoising = {k: p.default for k, p in inspect.signature(ContrastiveDenoising).parameters.items()}
    assert (
        denoising["num_queries"],
        denoising["label_noise_ratio"],
        denoising["box_noise_scale"],
        denoising["eps"],
    ) == (100, 0.5, 1.0, 1e-3)
    criterion = DINOCriterion(NUM_CLASSES)
    assert {
        k: criterion.weights[f"loss_{k.removeprefix('weight_')}"] for k in DINO_4SCALE_LOSS if k.startswith("weight_")
    } == {k: v for k, v in DINO_4SCALE_LOSS.items() if k.startswith("weight_")}
    assert (criterion.focal_alpha, criterion.focal_gamma) == (0.25, 2.0)
    matcher = criterion.matcher
    assert {k: getattr(matcher, k) for k in DINO_4SCALE_MATCHER} == DINO_4SCALE_MATCHER


def mixed_dino(batch, **overrides) -> DINO:
    """DINO itself: mixed query selection, denoising, and the official settings where Deformable DETR differs."""
    torch.manual_seed(0)
    dino_settings = {k: DINO_4SCALE[k] for k in DEFORMABLE_DETR}
    model = tiny_dino(batch[3], **{**dino_settings, "num_denoising": 12, **overrides}).train()
    perturb_(model)
    return model


def test_the_heads_read_each_layer_through_the_final_norm_and_references_do_not(batch) -> None:
    """Released DINO: each decoder layer's output goes through the decoder's LayerNorm before the class
    and box heads, while the next layer's reference boxes are refined from the un-normed output."""
    from vision_tx.heads.dino import inverse_sigmoid

    images, pixel_mask, _, _ = batch
    model = mixed_dino(batch, num_denoising=0).eval()
    raw = []
    hooks = [layer.register_forward_hook(lambda module, args, out: raw.append(out)) for layer in model.decoder.layers]
    with torch.no_grad():
        outputs = model(images, pixel_mask)
        for hook in hooks:
            hook.remove()
        assert len(raw) == LAYERS == 2
        eps = model.decoder.eps
        initial = outputs["enc_outputs"]["pred_boxes"]
        second_reference = (model.bbox_embed[0](raw[0]) + inverse_sigmoid(initial, eps)).sigmoid()
        normed = model.decoder.norm(raw[1])
        boxes = (model.bbox_embed[1](normed) + inverse_sigmoid(second_reference, eps)).sigmoid()
    torch.testing.assert_close(outputs["pred_logits"], model.class_embed[1](normed), rtol=0, atol=1e-6)
    torch.testing.assert_close(outputs["pred_boxes"], boxes, rtol=0, atol=1e-6)


def test_look_forward_twice_trains_the_previous_layer_and_no_earlier_one(batch) -> None:
    """DINO's look forward twice: the last layer's box reaches the box head of the layer before it,
    not the one before that; without it, only its own."""
    images, pixel_mask, _, _ = batch
    for look_forward_twice, reached in ((True, [False, True, True]), (False, [False, False, True])):
        model = mixed_dino(batch, num_decoder_layers=3, num_denoising=0, look_forward_twice=look_forward_twice)
        model(images, pixel_mask, dino_targets())["pred_boxes"].sum().backward()
        heads = model.bbox_embed[:3]
        assert [bool(head.layers[-1].weight.grad.abs().sum() > 0) for head in heads] == reached, look_forward_twice


def test_denoising_groups_see_no_other_group_and_matching_queries_see_none(batch) -> None:
    images, pixel_mask, _, _ = batch
    model = mixed_dino(batch)
    targets = dino_targets()
    torch.manual_seed(1)
    queries = model.denoising(targets, QUERIES)
    assert queries.num_groups == 4
    group_queries = 2 * queries.group_size
    model.denoising.forward = lambda *args: queries
    with torch.no_grad():
        reference = model(images, pixel_mask, targets)
        for group in range(queries.num_groups):
            changed = slice(group * group_queries, (group + 1) * group_queries)
            content, boxes = queries.content.clone(), queries.boxes.clone()
            queries.content[:, changed] += torch.randn_like(queries.content[:, changed])
            queries.boxes[:, changed] = torch.rand_like(queries.boxes[:, changed]) * 0.5 + 0.25
            out = model(images, pixel_mask, targets)
            queries.content, queries.boxes = content, boxes
            torch.testing.assert_close(out["pred_logits"], reference["pred_logits"], rtol=0, atol=0)
            torch.testing.assert_close(out["pred_boxes"], reference["pred_boxes"], rtol=0, atol=0)
            dn, dn_reference = out["dn_outputs"]["pred_logits"], reference["dn_outputs"]["pred_logits"]
            others = torch.ones(dn.shape[2], dtype=torch.bool)
            others[changed] = False
            torch.testing.assert_close(dn[:, :, others], dn_reference[:, :, others], rtol=0, atol=0)
            assert not torch.allclose(dn[:, :, changed], dn_reference[:, :, changed])


def test_without_denoising_the_training_loss_is_the_set_loss(batch) -> None:
    images, pixel_mask, _, _ = batch
    model = mixed_dino(batch)
    targets = dino_targets()
    with torch.no_grad():
        with_denoising = model.loss(model(images, pixel_mask, targets), targets)
        model.denoising = None
        plain = model.loss(model(images, pixel_mask, targets), targets)
    assert any("_dn" in key for key in with_denoising) and not any("_dn" in key for key in plain)
    set_terms = {k: v for k, v in with_denoising.items() if k.startswith("loss_") and "_dn" not in k}
    assert set(set_terms) == {k for k in plain if k.startswith("loss_")}
    for key, value in set_terms.items():
        torch.testing.assert_close(plain[key], value, rtol=0, atol=1e-6, msg=key)
    weights = {"ce": 1.0, "bbox": 5.0, "giou": 2.0}
    torch.testing.assert_close(plain["loss"], sum(weights[k.split("_")[1]] * v for k, v in set_terms.items()))
    assert with_denoising["loss"] > plain["loss"]


def test_trains_on_images_without_objects(batch) -> None:
    images, pixel_mask, _, _ = batch
    model = mixed_dino(batch)
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    losses = model.loss(model(images, pixel_mask, empty), empty)
    assert torch.isfinite(losses["loss"]) and losses["loss_bbox"] == 0
    losses["loss"].backward()


def test_matcher_rejects_softmax_costs_for_sigmoid_logits() -> None:
    with pytest.raises(ValueError, match="focal_alpha"):
        DINOCriterion(NUM_CLASSES, HungarianMatcher())


def sine_by_hand(boxes: torch.Tensor, num_feats: int) -> torch.Tensor:
    """DINO's sine embedding of (x, y, w, h) in [0, 1], written from the paper: each coordinate times
    2 pi over 10000 ** (2 * (i // 2) / num_feats), sin at even i, cos at odd i, coordinates concatenated."""
    i = torch.arange(num_feats, dtype=boxes.dtype)
    angles = boxes[..., None] * (2 * torch.pi) / 10000 ** (2 * torch.div(i, 2, rounding_mode="floor") / num_feats)
    return torch.where(i % 2 == 0, angles.sin(), angles.cos()).flatten(-2)


def test_mixed_selection_and_query_positions_follow_the_paper(batch) -> None:
    """DINO's mixed query selection: the K proposals whose best class scores highest give the initial
    boxes; each decoder layer reads around its input boxes scaled to each level's valid area, with
    the query position ref_point_head(sine embedding of those boxes on level 0)."""
    images, pixel_mask, _, _ = batch
    torch.manual_seed(0)
    model = perturb_(tiny_dino(batch[3], query_selection="mixed", num_denoising=0)).eval()
    calls = []
    for layer in model.decoder.layers:
        layer.register_forward_pre_hook(lambda _module, args: calls.append((args[1], args[2])))
    with torch.no_grad():
        levels = model.neck(batch[3], pixel_mask)
        memory = model.encoder(levels.tokens, levels.position, levels.padding_mask, levels.shapes, levels.valid_ratios)
        out = model.forward_decoder(dataclasses.replace(levels, tokens=memory))
        # The proposals' scores by hand: every valid token's best class logit.
        _, valid = proposal_anchors(levels)
        features = model.enc_output_norm(model.enc_output(memory * valid[..., None]))
        logits = model.class_embed[-1](features)
        best = logits.max(-1).values.topk(QUERIES, dim=1).indices
        torch.testing.assert_close(
            out["enc_outputs"]["pred_logits"], torch.stack([logits[b, best[b]] for b in range(len(best))])
        )
        assert not torch.equal(best, logits[..., 0].topk(QUERIES, dim=1).indices)  # not the first class's ranking

        inputs = [out["enc_outputs"]["pred_boxes"], *(aux["pred_boxes"] for aux in out["aux_outputs"])]
        assert len(calls) == LAYERS
        for (query_pos, reference), boxes in zip(calls, inputs):
            ratios = levels.valid_ratios.repeat(1, 1, 2)  # [B, L, 4] (w, h, w, h)
            torch.testing.assert_close(reference, boxes[:, :, None] * ratios[:, None])
            expected = model.decoder.ref_point_head(sine_by_hand(boxes * ratios[:, None, 0], DIM // 2))
            torch.testing.assert_close(query_pos, expected, rtol=0, atol=1e-6)  # measured: equal
    assert (levels.valid_ratios < 1).any()  # the padding makes the scaling visible


def mixed_dino_training_losses(batch) -> tuple[list[dict[str, torch.Tensor]], dict, dict[str, torch.Tensor]]:
    """The targets, training outputs and losses of :func:`mixed_dino` on ``batch``."""
    images, pixel_mask, _, _ = batch
    model = mixed_dino(batch)
    targets = dino_targets()
    with torch.no_grad():
        out = model(images, pixel_mask, targets)
        return targets, out, model.loss(out, targets)


def test_denoising_losses_are_per_target_and_group(batch) -> None:
    """The denoising losses of the last layer, by hand: the positive query of target k in group g is
    slot g * 2 * group_size + k; focal loss over every denoising query (one-hot on the positives),
    L1 and 1 - GIoU on the positives, each divided by the number of targets times the groups."""
    from torchvision.ops import box_convert, generalized_box_iou, sigmoid_focal_loss

    targets, out, losses = mixed_dino_training_losses(batch)
    queries = out["dn_outputs"]["queries"]
    logits, boxes = out["dn_outputs"]["pred_logits"][-1], out["dn_outputs"]["pred_boxes"][-1]
    onehot = torch.zeros_like(logits)
    l1 = giou = 0.0
    for image, target in enumerate(targets):
        for group in range(queries.num_groups):
            for k, (label, box) in enumerate(zip(target["labels"], target["boxes"])):
                slot = group * 2 * queries.group_size + k
                onehot[image, slot, label] = 1.0
                l1 += (boxes[image, slot] - box).abs().sum()
                pair = box_convert(torch.stack([boxes[image, slot], box]), "cxcywh", "xyxy")
                giou += 1 - generalized_box_iou(pair[:1], pair[1:])[0, 0]
    count = sum(len(t["labels"]) for t in targets) * queries.num_groups
    assert queries.num_groups == 4
    torch.testing.assert_close(losses["loss_bbox_dn"], l1 / count)
    torch.testing.assert_close(losses["loss_giou_dn"], giou / count)
    torch.testing.assert_close(losses["loss_ce_dn"], sigmoid_focal_loss(logits, onehot, 0.25, 2.0, "sum") / count)


def test_every_loss_term_of_mixed_selection_by_hand(batch) -> None:
    """Every term DINO trains on, written from the paper and the official config: each decoder layer and
    the encoder's selected proposals (class-aware in mixed selection) Hungarian-matched on the focal
    class cost (weight 2) + L1 (5) + GIoU (2) by scipy, then focal loss (alpha 0.25, gamma 2), L1 and
    1 - GIoU over the matched pairs, each divided by the number of targets; each layer's denoising
    queries on their known positives, divided by the targets times the groups; the total weighted
    1 (classes), 5 (L1), 2 (GIoU)."""
    from scipy.optimize import linear_sum_assignment
    from torchvision.ops import box_convert, generalized_box_iou, sigmoid_focal_loss

    targets, out, losses = mixed_dino_training_losses(batch)
    count = sum(len(t["labels"]) for t in targets)
    xyxy = lambda b: box_convert(b, "cxcywh", "xyxy")  # noqa: E731

    def terms(logits, boxes, pairs, divisor):
        onehot, l1, giou = torch.zeros_like(logits), 0.0, 0.0
        for image, query, box, label in pairs:
            onehot[image, query, label] = 1.0
            l1 += (boxes[image, query] - box).abs().sum()
            giou += 1 - generalized_box_iou(xyxy(boxes[image, query][None]), xyxy(box[None]))[0, 0]
        return sigmoid_focal_loss(logits, onehot, 0.25, 2.0, "sum") / divisor, l1 / divisor, giou / divisor

    def matched(logits, boxes):
        pairs = []
        for image, target in enumerate(targets):
            prob = logits[image].sigmoid()
            positive = 0.25 * (1 - prob) ** 2 * -(prob + 1e-8).log()
            negative = 0.75 * prob**2 * -(1 - prob + 1e-8).log()
            cost = (
                2 * (positive - negative)[:, target["labels"]]
                + 5 * torch.cdist(boxes[image], target["boxes"], p=1)
                - 2 * generalized_box_iou(xyxy(boxes[image]), xyxy(target["boxes"]))
            )
            for query, k in zip(*linear_sum_assignment(cost.numpy())):
                pairs.append((image, query, target["boxes"][k], target["labels"][k]))
        return pairs

    expected = {}
    layers = {**{f"_{i}": aux for i, aux in enumerate(out["aux_outputs"])}, "": out, "_enc": out["enc_outputs"]}
    assert out["enc_outputs"]["pred_logits"].shape[-1] == NUM_CLASSES  # mixed selection: class-aware proposals
    for name, layer in layers.items():
        ce, l1, giou = terms(
            layer["pred_logits"], layer["pred_boxes"], matched(layer["pred_logits"], layer["pred_boxes"]), count
        )
        expected |= {f"loss_ce{name}": ce, f"loss_bbox{name}": l1, f"loss_giou{name}": giou}
    queries = out["dn_outputs"]["queries"]
    dn_logits, dn_boxes = out["dn_outputs"]["pred_logits"], out["dn_outputs"]["pred_boxes"]
    positives = [
        (image, group * 2 * queries.group_size + k, box, label)
        for image, target in enumerate(targets)
        for group in range(queries.num_groups)
        for k, (box, label) in enumerate(zip(target["boxes"], target["labels"]))
    ]
    for layer in range(len(dn_logits)):
        name = "_dn" if layer == len(dn_logits) - 1 else f"_dn_{layer}"
        ce, l1, giou = terms(dn_logits[layer], dn_boxes[layer], positives, count * queries.num_groups)
        expected |= {f"loss_ce{name}": ce, f"loss_bbox{name}": l1, f"loss_giou{name}": giou}
    assert set(expected) == {key for key in losses if key.startswith("loss_")} and len(expected) == 3 * (2 * LAYERS + 1)
    for key, value in expected.items():
        torch.testing.assert_close(losses[key], value, rtol=1e-5, atol=1e-6, msg=key)
    weights = {"ce": 1.0, "bbox": 5.0, "giou": 2.0}
    torch.testing.assert_close(
        losses["loss"], sum(weights[key.split("_")[1]] * value for key, value in expected.items())
    )


def test_exact_valid_ratios_place_every_level_on_the_pixels_its_cells_cover(batch) -> None:
    """``exact_valid_ratios``: the encoder and decoder read each level (strides 8, 16, 32 and the extra 64) through the
    image's share of the pixels its cells cover, ``w / (w_i * stride_i)``, the 72 x 56 image of the 112 x 80 batch
    included; the official convention (the default) reads the share of cells its padding mask leaves valid."""
    images, pixel_mask, _, maps = batch
    seen = {}
    image = torch.tensor([[112.0, 80.0], [72.0, 56.0]])  # (w, h)
    for exact in (False, True):
        torch.manual_seed(0)
        model = perturb_(tiny_dino(maps, query_selection="mixed", num_denoising=0, exact_valid_ratios=exact)).eval()
        model.encoder.register_forward_pre_hook(lambda _module, args: seen.__setitem__(exact, args[-1]))
        with torch.no_grad():
            model(images, pixel_mask)
    shapes = [(m.shape[-2], m.shape[-1]) for m in maps] + [(1, 2)]
    expected = torch.stack([image / torch.tensor([w * s, h * s]) for (h, w), s in zip(shapes, (8, 16, 32, 64))], 1)
    torch.testing.assert_close(seen[True], expected)
    cells = torch.stack(
        [
            torch.tensor([[1.0, 1.0], [w_valid / w, h_valid / h]])
            for (h, w), (h_valid, w_valid) in zip(shapes, [(7, 9), (4, 5), (2, 2), (1, 2)])
        ],
        1,
    )  # the second image's valid cells, nearest-sampled
    torch.testing.assert_close(seen[False], cells)


def test_the_constructor_takes_one_query_selections_parts(batch) -> None:
    """DINO's constructor keeps the parts :meth:`DINO.build` makes: the learned query content (mixed selection) or
    the proposals' projection (two-stage), never both nor neither, and the selection follows from which."""
    mixed = tiny_dino(batch[3], query_selection="mixed", num_denoising=0)
    two_stage = tiny_dino(batch[3])
    parts = dict(
        backbone=mixed.backbone,
        neck=mixed.neck,
        encoder=mixed.encoder,
        decoder=mixed.decoder,
        heads=QueryHeads(mixed.class_embed, mixed.bbox_embed, mixed.enc_output, mixed.enc_output_norm),
        denoising=None,
        criterion=mixed.criterion,
        num_classes=NUM_CLASSES,
        num_queries=QUERIES,
        look_forward_twice=True,
        exact_valid_ratios=False,
        num_detections=100,
        nms_threshold=None,
        share_scores=False,
    )
    projection = dict(pos_trans=two_stage.pos_trans, pos_trans_norm=two_stage.pos_trans_norm)
    assert DINO(**parts, query_embed=mixed.query_embed, pos_trans=None, pos_trans_norm=None).query_selection == "mixed"
    assert DINO(**parts, query_embed=None, **projection).query_selection == "two_stage"
    neither = dict(query_embed=None, pos_trans=None, pos_trans_norm=None)
    half = dict(query_embed=None, pos_trans=two_stage.pos_trans, pos_trans_norm=None)
    for wrong in (dict(query_embed=mixed.query_embed, **projection), neither, half):
        with pytest.raises(ValueError, match="give query_embed"):
            DINO(**parts, **wrong)

"""D-FINE against transformers' DFineForObjectDetection on the same backbone maps and weights (every parameter
and the fixed W(n) settings moved off their initial values): every decoder layer's logits, boxes and edge
logits, each loss term (denoising off: the matching is deterministic) and the gradients; and the pieces
(W(n), the FGL targets) against transformers' functions."""

from __future__ import annotations

import copy
import re

import torch
from torch import nn

from tests.conftest import require_reference
from tests.models.test_dino import MapsBackbone
from tests.models.test_rtdetr import (
    CHANNELS,
    LAYERS,
    NUM_CLASSES,
    QUERIES,
    backbone_maps,
    images_and_mask,
    rtdetr_targets,
)
from tests.models.test_rtdetr import to_transformers as rtdetr_to_transformers
from tests.parity import perturb_
from vision_tx.heads.detr.criterion import box_losses
from vision_tx.heads.dfine import edge_targets, weighting_function
from vision_tx.heads.dfine.criterion import union_matches
from vision_tx.models import DETECTORS, DFINE

transformers = require_reference("transformers")
_loss = require_reference("transformers.loss.loss_d_fine")
_outputs = require_reference("transformers.modeling_outputs")

DIM, REG_MAX, POINTS = 32, 8, (2, 3, 2)


def to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in transformers' names: RT-DETR's mapping, D-FINE's MLP names for the FFNs."""
    renamed = {
        re.sub(r"\.mlp\.fc(\d)\.", lambda m: f".mlp.layers.{int(m[1]) - 1}.", k): v
        for k, v in rtdetr_to_transformers(state).items()
    }
    return {k: v for k, v in renamed.items() if not k.startswith("model.backbone.")}


def ours_and_transformers(dtype: torch.dtype = torch.float32, **overrides) -> tuple[DFINE, nn.Module]:
    """Our D-FINE with moved weights and transformers' loaded from it (in ``dtype``), both given the same backbone
    maps."""
    maps = backbone_maps(dtype)
    torch.manual_seed(0)
    kwargs = dict(
        num_queries=QUERIES,
        hidden_dim=DIM,
        num_heads=4,
        num_encoder_layers=2,
        encoder_feedforward=48,
        expansion=0.5,
        num_blocks=1,
        num_decoder_layers=LAYERS,
        dim_feedforward=40,
        num_points=POINTS,
        reg_max=REG_MAX,
        lqe_hidden_dim=16,
        num_denoising=0,
        criterion_kwargs={"reg_max": REG_MAX, "union_matching": False},  # transformers' port matches per layer
    )
    ours = perturb_(DFINE.build(MapsBackbone(maps), NUM_CLASSES, **{**kwargs, **overrides}))
    with torch.no_grad():  # perturb_ leaves zero-initialised layers near 0 (2e-3): the quality term would not show
        for lqe in ours.decoder.lqe_layers:
            lqe.reg_conf.layers[-1].weight.copy_(
                torch.randn(lqe.reg_conf.layers[-1].weight.shape, generator=torch.Generator().manual_seed(1))
            )
    config = transformers.DFineConfig(
        backbone_config=transformers.ResNetConfig(
            out_features=["stage2", "stage3", "stage4"],
            hidden_sizes=[8, *CHANNELS],
            embedding_size=8,
            depths=[1, 1, 1, 1],
        ),
        num_labels=NUM_CLASSES,
        d_model=DIM,
        encoder_hidden_dim=DIM,
        encoder_in_channels=list(CHANNELS),
        encoder_layers=2,
        encoder_ffn_dim=48,
        encoder_attention_heads=4,
        decoder_in_channels=[DIM] * 3,
        decoder_ffn_dim=40,
        decoder_layers=LAYERS,
        decoder_attention_heads=4,
        decoder_n_points=list(POINTS),
        num_queries=QUERIES,
        num_denoising=0,
        max_num_bins=REG_MAX,
        lqe_hidden_dim=16,
        hidden_expansion=0.5,
        depth_mult=1 / 3,
    )
    config._attn_implementation = "eager"
    reference = transformers.DFineForObjectDetection(config)
    state = to_transformers(ours.state_dict())
    skipped = re.compile(
        r"^model\.backbone\.|^(class_embed|bbox_embed)\.|num_points_scale$"
    )  # the top-level heads: tied copies
    assert set(state) == {k for k in reference.state_dict() if not skipped.search(k)}
    reference.load_state_dict(state, strict=False)
    reference.model.backbone.forward = lambda pixel_values, pixel_mask: [(m, None) for m in maps]
    return ours.to(dtype), reference.to(dtype)


def test_weighting_function_and_fgl_targets_are_transformers() -> None:
    up, reg_scale = torch.tensor([0.7], dtype=torch.float64), torch.tensor([3.2], dtype=torch.float64)
    torch.testing.assert_close(
        weighting_function(REG_MAX, up, reg_scale), _loss.weighting_function(REG_MAX, up, reg_scale), rtol=0, atol=1e-12
    )
    up, reg_scale = up.float(), reg_scale.float()  # transformers' targets are float32
    generator = torch.Generator().manual_seed(0)
    initial = torch.cat(
        [0.3 + 0.4 * torch.rand(40, 2, generator=generator), 0.05 + 0.3 * torch.rand(40, 2, generator=generator)], 1
    )
    targets = torch.cat(
        [0.2 + 0.6 * torch.rand(40, 2, generator=generator), 0.02 + 0.6 * torch.rand(40, 2, generator=generator)], 1
    )
    left, share = edge_targets(initial, targets, REG_MAX, up, reg_scale)
    from transformers.image_transforms import center_to_corners_format

    label, right, left_weight = _loss.bbox2distance(initial, center_to_corners_format(targets), REG_MAX, reg_scale, up)
    assert ((share == 0) | (share == 1)).any() and ((share > 0) & (share < 1)).any()  # in and out of W(n)'s range
    assert torch.equal(left, label.long())
    torch.testing.assert_close(share, right, rtol=0, atol=1e-6)
    torch.testing.assert_close(1 - share, left_weight, rtol=0, atol=1e-6)


def test_decoder_layers_match_transformers() -> None:
    """Training mode (BatchNorm on batch statistics), no targets: the encoder's maps, layer 0's direct boxes and
    logits, every layer's logits (with the quality term), boxes, edge logits and the edges' origin; in
    inference the last layer's (measured in float32: maps 3.7e-6, logits 1.4e-6, boxes and edge logits 6e-8)."""
    ours, reference = ours_and_transformers()
    images, pixel_mask = images_and_mask()
    captured = {}
    hook = ours.encoder.register_forward_hook(lambda module, args, out: captured.update(maps=out))
    with torch.no_grad():
        out = ours.train()(images, pixel_mask)
        ref = reference.train()(images, pixel_mask=(~pixel_mask).long())
    hook.remove()
    for ours_map, ref_map in zip(captured["maps"], ref.encoder_last_hidden_state, strict=True):
        torch.testing.assert_close(ours_map, ref_map, rtol=0, atol=2e-5)
    torch.testing.assert_close(out["pre_outputs"]["pred_logits"], ref.intermediate_logits[:, 0], rtol=0, atol=2e-5)
    torch.testing.assert_close(
        out["pre_outputs"]["pred_boxes"], ref.intermediate_reference_points[:, 0], rtol=0, atol=2e-5
    )
    torch.testing.assert_close(out["enc_outputs"]["pred_boxes"], ref.enc_topk_bboxes, rtol=0, atol=2e-5)
    layers = [*out["aux_outputs"], out]
    for layer, outputs in enumerate(layers):
        torch.testing.assert_close(outputs["pred_logits"], ref.intermediate_logits[:, layer + 1], rtol=0, atol=2e-5)
        torch.testing.assert_close(
            outputs["pred_boxes"], ref.intermediate_reference_points[:, layer + 1], rtol=0, atol=2e-5
        )
        torch.testing.assert_close(
            outputs["pred_corners"], ref.intermediate_predicted_corners[:, layer], rtol=0, atol=2e-5
        )
        torch.testing.assert_close(outputs["ref_points"], ref.initial_reference_points[:, layer], rtol=0, atol=2e-5)
    assert ref.logits.std() > 0.3 and ref.intermediate_predicted_corners.std() > 0.1  # not near-constant outputs
    assert (out["pred_boxes"] - out["aux_outputs"][0]["pred_boxes"]).abs().mean() > 0.001  # the layers refine
    with torch.no_grad():
        inference, ref_inference = (
            ours.eval()(images, pixel_mask),
            reference.eval()(images, pixel_mask=(~pixel_mask).long()),
        )
    torch.testing.assert_close(inference["pred_logits"], ref_inference.logits, rtol=0, atol=2e-5)
    torch.testing.assert_close(inference["pred_boxes"], ref_inference.pred_boxes, rtol=0, atol=2e-5)


def transformers_losses(model: nn.Module, ref, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """transformers' DFineLoss on its model's outputs in the official layout (every earlier layer with the last
    as teacher, layer 0's direct boxes, the encoder's proposals; their port pairs the layers off by one)."""
    logits, boxes, config = ref.intermediate_logits, ref.intermediate_reference_points, model.config
    corners, origins = ref.intermediate_predicted_corners, ref.initial_reference_points
    teacher = {"teacher_corners": corners[:, -1], "teacher_logits": logits[:, -1]}
    aux = [
        {
            "logits": logits[:, i + 1],
            "pred_boxes": boxes[:, i + 1],
            "pred_corners": corners[:, i],
            "ref_points": origins[:, i],
            **teacher,
        }
        for i in range(LAYERS - 1)
    ]
    aux += [
        {"logits": logits[:, 0], "pred_boxes": boxes[:, 0]},
        {"logits": ref.enc_topk_logits, "pred_boxes": ref.enc_topk_bboxes},
    ]
    last = {
        "logits": logits[:, -1],
        "pred_boxes": boxes[:, -1],
        "pred_corners": corners[:, -1],
        "ref_points": origins[:, -1],
    }
    last.update(teacher_corners=corners[:, -1], teacher_logits=logits[:, -1])  # the teacher itself: no DDF
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"].to(logits.dtype)} for t in targets]
    # their loss reads W(n)'s settings from the config, the official one (and ours) from the model
    config = copy.deepcopy(config)
    config.up, config.reg_scale = float(model.model.decoder.up), float(model.model.decoder.reg_scale)
    losses = _loss.DFineLoss(config)({**last, "auxiliary_outputs": aux}, labels)
    return {k: v for k, v in losses.items() if k != "loss_ddf"}


def ours_in_transformers_names(losses: dict[str, torch.Tensor], weights: dict[str, float]) -> dict[str, torch.Tensor]:
    renamed = {}
    for key, value in losses.items():
        match = re.match(r"^(loss_vfl|loss_bbox|loss_giou|loss_fgl|loss_ddf)(?:_(enc|pre|\d+))?$", key)
        if match:
            name, part = match.groups()
            suffix = {None: "", "pre": f"_aux_{LAYERS - 1}", "enc": f"_aux_{LAYERS}"}.get(part, f"_aux_{part}")
            renamed[name + suffix] = value * weights[name]
    return renamed


def overlapping_targets(ours: DFINE) -> list[dict[str, torch.Tensor]]:
    """Targets near some of the last layer's boxes (so that the IoU-weighted terms are not ~0)."""
    images, pixel_mask = images_and_mask()
    with torch.no_grad():
        boxes = ours.train()(images, pixel_mask)["pred_boxes"].float()
    scale = torch.tensor([1.0, 1.0, 1.6, 1.3])
    return [
        {"labels": torch.tensor([1, 4, 2]), "boxes": (boxes[0, [0, 2, 5]] * scale + 0.01).clamp(0.02, 0.98)},
        {"labels": torch.tensor([3]), "boxes": (boxes[1, [1]] * scale - 0.01).clamp(0.02, 0.98)},
    ]


WEIGHTS = {"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5}


def test_losses_match_transformers() -> None:
    """Each weighted term: VFL, L1, GIoU of every layer, layer 0's direct boxes and the proposals, FGL of every
    layer and DDF of the earlier ones (measured: 3e-7; GIoU 5.1e-6)."""
    ours, reference = ours_and_transformers()
    targets = overlapping_targets(ours)
    images, pixel_mask = images_and_mask()
    with torch.no_grad():
        losses = ours.train().loss(ours(images, pixel_mask, targets), targets)
        expected = transformers_losses(reference, reference.train()(images, pixel_mask=(~pixel_mask).long()), targets)
    renamed = ours_in_transformers_names(losses, WEIGHTS)
    assert set(renamed) == set(expected) and len(renamed) == 3 * (LAYERS + 2) + LAYERS + LAYERS - 1
    for key, value in expected.items():  # torchvision's GIoU adds 1e-7 to the union, transformers' nothing
        torch.testing.assert_close(renamed[key], value, rtol=0, atol=3e-5 if "giou" in key else 1e-5, msg=key)
    assert all(expected[f"loss_fgl{s}"] > 1e-3 for s in ("", "_aux_0")) and all(
        expected[f"loss_ddf_aux_{i}"] > 3e-3 for i in range(LAYERS - 1)
    )
    torch.testing.assert_close(losses["loss"], sum(expected.values()), rtol=0, atol=1e-4)  # 5 GIoU terms


def test_gradients_match_transformers() -> None:
    """Every parameter's gradient of the whole loss, the encoder's included (float32: transformers' FGL targets
    are float32 only; measured: within 1.1e-5 of each parameter's largest gradient, the GIoU's eps as above)."""
    ours, reference = ours_and_transformers()
    targets = overlapping_targets(ours)
    images, pixel_mask = images_and_mask()
    ours.train().loss(ours.train()(images, pixel_mask, targets), targets)["loss"].backward()
    sum(
        transformers_losses(reference, reference.train()(images, pixel_mask=(~pixel_mask).long()), targets).values()
    ).backward()
    grads = to_transformers({n: p.grad for n, p in ours.named_parameters() if p.grad is not None})
    # zero but for float32 rounding (~1e-9): keys' biases (the softmax ignores them) and the shifts a BatchNorm on
    # batch statistics removes downstream (BatchNorm biases before another BatchNorm, the last AIFI norm's bias)
    expected = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None and p.grad.abs().max() > 1e-6}
    for name in (
        "model.decoder.bbox_embed.0.layers.2.weight",
        "model.decoder.lqe_layers.1.reg_conf.layers.0.weight",
        "model.decoder.layers.2.gateway.gate.weight",
        "model.decoder.pre_bbox_head.layers.2.weight",
        "model.decoder.layers.0.encoder_attn.sampling_offsets.weight",
        "model.enc_score_head.weight",
    ):
        assert name in expected, name
    assert {n for n, g in grads.items() if g.abs().max() > 1e-6} == set(expected) and len(expected) > 300
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-4 * grad.abs().max().item(), msg=name)


def test_registered_trains_with_denoising_and_on_images_without_objects() -> None:
    assert DETECTORS["dfine"].func is DFINE and not DETECTORS["dfine"].keywords
    torch.manual_seed(0)
    ours = DFINE.build(
        MapsBackbone(backbone_maps()),
        NUM_CLASSES,
        num_queries=QUERIES,
        hidden_dim=DIM,
        num_heads=4,
        num_decoder_layers=LAYERS,
        num_blocks=1,
        num_denoising=12,
    )
    images, pixel_mask = images_and_mask()
    losses = ours.train().loss(ours(images, pixel_mask, rtdetr_targets()), rtdetr_targets())
    assert {"loss_fgl_dn", "loss_ddf_dn_0", "loss_vfl_dn_pre", "loss_fgl_pre"} & set(losses) == {
        "loss_fgl_dn",
        "loss_ddf_dn_0",
        "loss_vfl_dn_pre",
    }
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    losses = ours.loss(ours(images, pixel_mask, empty), empty)
    assert torch.isfinite(losses["loss"]) and losses["loss_fgl"] == 0
    losses["loss"].backward()


def test_union_of_the_layers_matches_is_the_official_go_indices() -> None:
    """Every pair any layer matched, each query keeping its most frequent target (a tie: the smaller one)."""
    q = torch.tensor
    layers = [
        [(q([1, 3, 5]), q([0, 1, 2])), (q([0]), q([0]))],
        [(q([1, 4, 5, 3]), q([0, 1, 3, 2])), (q([2]), q([0]))],
        [(q([1, 3]), q([0, 1])), (q([0]), q([0]))],
    ]
    union = union_matches(layers)
    assert [dict(zip(rows.tolist(), cols.tolist())) for rows, cols in union] == [{1: 0, 3: 1, 4: 1, 5: 2}, {0: 0, 2: 0}]


def test_union_matching_trains_every_layers_boxes_on_the_union() -> None:
    """With ``union_matching`` (the default) each layer's L1, GIoU and FGL read the union of the matches of the
    decoder layers, layer 0's direct boxes and the proposals (the matcher called here per layer)."""
    ours, _ = ours_and_transformers(criterion_kwargs={"reg_max": REG_MAX})
    near, far = overlapping_targets(ours), rtdetr_targets()  # the proposals match some far targets otherwise
    targets = [{key: torch.cat([a[key], b[key]]) for key in ("labels", "boxes")} for a, b in zip(near, far)]
    images, pixel_mask = images_and_mask()
    with torch.no_grad():
        outputs = ours.train()(images, pixel_mask, targets)
        losses = ours.loss(outputs, targets)
        layers = [*outputs["aux_outputs"], outputs, outputs["enc_outputs"], outputs["pre_outputs"]]
        union = union_matches(
            [ours.criterion.matcher(layer["pred_logits"], layer["pred_boxes"], targets) for layer in layers]
        )
        image = torch.cat([torch.full_like(rows, i) for i, (rows, _) in enumerate(union)])
        query = torch.cat([rows for rows, _ in union])
        target_boxes = torch.cat([t["boxes"][cols] for t, (_, cols) in zip(targets, union)])
        count = torch.tensor(float(len(query)))
    assert count > sum(len(t["labels"]) for t in targets)  # the layers disagree: the union is larger
    for layer, name in zip(layers, ["_0", "_1", "", "_enc", "_pre"]):
        loss_bbox, loss_giou = box_losses(layer["pred_boxes"][image, query], target_boxes, count)
        torch.testing.assert_close(losses[f"loss_bbox{name}"], loss_bbox, rtol=0, atol=1e-6)
        torch.testing.assert_close(losses[f"loss_giou{name}"], loss_giou, rtol=0, atol=1e-6)
    per_layer = ours_and_transformers()[0].loss(outputs, targets)
    assert losses["loss_fgl"] != per_layer["loss_fgl"] and losses["loss_vfl"] == per_layer["loss_vfl"]

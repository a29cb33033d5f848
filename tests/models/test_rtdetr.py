"""RT-DETR against transformers' RTDetrForObjectDetection on the same backbone maps, weights and
denoising draws: the hybrid encoder, the selected proposals, every decoder layer, the loss and the
gradients."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.func import functional_call

from tests.conftest import require_reference
from tests.models.test_dino import MapsBackbone
from tests.parity import perturb_
from vision_tx.backbones import build_backbone
from vision_tx.heads.rtdetr import sincos_position_embedding
from vision_tx.models import DETECTORS, RTDETR
from vision_tx.models.query_detector import proposal_anchors

transformers = require_reference("transformers")
_modeling = require_reference("transformers.models.rt_detr.modeling_rt_detr")

NUM_CLASSES, DIM, QUERIES, LAYERS, DENOISING = 5, 32, 10, 3, 12
CHANNELS = (16, 24, 40)  # the stride 8, 16, 32 maps
MAP_SIZE = (8, 12)  # stride 8; then (4, 6) and (2, 3)

# vision_tx name -> transformers name, applied in order (nn.MultiheadAttention's q/k/v rows are split separately).
_TO_TRANSFORMERS = [
    (r"^encoder\.input_proj\.", "model.encoder_input_proj."),
    (r"^encoder\.encoder\.layers\.", "model.encoder.aifi.0.layers."),
    (r"^encoder\.", "model.encoder."),
    (r"^decoder\.ref_point_head\.", "model.decoder.query_pos_head."),
    (r"^(decoder|decoder_input_proj)\.", r"model.\1."),
    (r"^enc_output\.", "model.enc_output.0."),
    (r"^enc_output_norm\.", "model.enc_output.1."),
    (r"^denoising\.label_embed\.", "model.denoising_class_embed."),
    (r"\.ffn\.linear(\d)\.", r".mlp.fc\1."),
    (r"(aifi\.0\.layers\.\d+)\.linear(\d)\.", r"\1.mlp.fc\2."),
    (r"\.ffn\.norm\.", ".final_layer_norm."),
    (r"(aifi\.0\.layers\.\d+)\.norm2\.", r"\1.final_layer_norm."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.encoder_attn_layer_norm."),
    (r"\.norm1\.", ".self_attn_layer_norm."),
]


def to_transformers(state: dict[str, torch.Tensor], num_layers: int = LAYERS) -> dict[str, torch.Tensor]:
    """Our state dict (of a model with ``num_layers`` decoder layers) in transformers' names."""
    converted = {}
    for key, value in state.items():
        head = re.match(r"^(class_embed|bbox_embed)\.(\d+)\.(.*)$", key)
        if head:  # the last head scores the encoder's proposals
            last = int(head[2]) == num_layers
            name = {"class_embed": "enc_score_head", "bbox_embed": "enc_bbox_head"}[head[1]]
            converted[f"model.{name}.{head[3]}" if last else f"model.decoder.{key}"] = value
            continue
        for pattern, replacement in _TO_TRANSFORMERS:
            key = re.sub(pattern, replacement, key)
        if key.endswith(("in_proj_weight", "in_proj_bias")):
            prefix, kind = key.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                converted[f"{prefix}.{name}.{kind}"] = part
        elif key == "model.denoising_class_embed.weight":  # + the padding row (zero)
            converted[key] = torch.cat([value, value.new_zeros(1, value.shape[1])])
        else:
            converted[key] = value
    return converted


def backbone_maps(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    height, width = MAP_SIZE
    maps = []
    for level, channels in enumerate(CHANNELS):
        size = (-(-height // 2**level), -(-width // 2**level))
        maps.append(torch.randn(2, channels, *size, generator=generator, dtype=torch.float64).to(dtype))
    return maps


def rtdetr_targets() -> list[dict[str, torch.Tensor]]:
    return [
        {
            "labels": torch.tensor([1, 4, 2]),
            "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1], [0.6, 0.4, 0.3, 0.2]]),
        },
        {"labels": torch.tensor([3]), "boxes": torch.tensor([[0.45, 0.55, 0.25, 0.15]])},
    ]


def ours_and_transformers(
    dtype: torch.dtype = torch.float32, **overrides
) -> tuple[RTDETR, nn.Module, list[torch.Tensor]]:
    """Our RT-DETR with moved weights and transformers' loaded from it (in ``dtype``, eval mode), and the maps."""
    maps = backbone_maps(dtype)
    torch.manual_seed(0)
    kwargs = dict(
        num_queries=QUERIES,
        hidden_dim=DIM,
        num_heads=4,
        num_encoder_layers=2,
        encoder_feedforward=48,
        num_decoder_layers=LAYERS,
        dim_feedforward=40,
        num_points=3,
        num_denoising=DENOISING,
        look_forward_twice=False,
    )
    ours = RTDETR.build(MapsBackbone(maps), NUM_CLASSES, **{**kwargs, **overrides}).eval()
    perturb_(ours)
    config = transformers.RTDetrConfig(
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
        decoder_n_points=3,
        num_queries=QUERIES,
        num_denoising=DENOISING,
    )
    config._attn_implementation = "eager"
    reference = transformers.RTDetrForObjectDetection(config).eval()
    state = to_transformers(ours.state_dict())
    backbone_keys = {k for k in reference.state_dict() if k.startswith("model.backbone.")}
    assert set(state) == set(reference.state_dict()) - backbone_keys
    reference.load_state_dict(state, strict=False)
    reference.model.backbone.forward = lambda pixel_values, pixel_mask: [(m, None) for m in maps]
    return ours.to(dtype), reference.to(dtype), maps


@pytest.fixture(scope="module")
def models():
    return ours_and_transformers()


def images_and_mask(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    height, width = MAP_SIZE[0] * 8, MAP_SIZE[1] * 8
    return torch.zeros(2, 3, height, width, dtype=dtype), torch.zeros(2, height, width, dtype=torch.bool)


def test_position_embedding_is_transformers_2d_sincos() -> None:
    expected = _modeling.build_2d_sinusoidal_position_embedding(3, 5, 16, 10000.0, dtype=torch.float64)
    torch.testing.assert_close(sincos_position_embedding(3, 5, 16, dtype=torch.float64), expected, rtol=0, atol=0)


def test_encoder_proposals_and_decoder_match_transformers(models) -> None:
    """Inference (BatchNorm on its perturbed running statistics): the hybrid encoder's maps, the
    selected proposals and every decoder layer's logits and boxes (measured: within 2e-6 in float32)."""
    ours, reference, _ = models
    images, pixel_mask = images_and_mask()
    captured = {}
    hook = ours.encoder.register_forward_hook(lambda module, args, out: captured.update(maps=out))
    with torch.no_grad():
        out = ours(images, pixel_mask)
        ref = reference(images, pixel_mask=(~pixel_mask).long())
    hook.remove()
    for ours_map, ref_map in zip(captured["maps"], ref.encoder_last_hidden_state):
        torch.testing.assert_close(ours_map, ref_map, rtol=0, atol=2e-5)
    torch.testing.assert_close(out["enc_outputs"]["pred_logits"], ref.enc_topk_logits, rtol=0, atol=2e-5)
    torch.testing.assert_close(out["enc_outputs"]["pred_boxes"], ref.enc_topk_bboxes, rtol=0, atol=2e-5)
    layers = [*out["aux_outputs"], out]
    assert len(layers) == LAYERS
    for layer, outputs in enumerate(layers):
        torch.testing.assert_close(outputs["pred_logits"], ref.intermediate_logits[:, layer], rtol=0, atol=2e-5)
        torch.testing.assert_close(
            outputs["pred_boxes"], ref.intermediate_reference_points[:, layer], rtol=0, atol=2e-5
        )
    assert ref.logits.std() > 0.3 and ref.pred_boxes.std() > 0.05  # not near-constant outputs
    assert (out["pred_boxes"] - out["aux_outputs"][0]["pred_boxes"]).abs().mean() > 0.003  # the layers refine


def same_denoising(ours: RTDETR, targets: list[dict[str, torch.Tensor]]) -> None:
    """Draws our denoising queries once and makes both models use them (transformers' label ids are
    recovered from our label embeddings: padding slots take its padding id)."""
    queries = ours.denoising(targets, QUERIES)
    ours.denoising.forward = lambda *args: queries
    table = ours.denoising.label_embed.weight.detach()
    labels = (queries.content.detach()[..., None, :] - table).abs().sum(-1).argmin(-1)
    labels[queries.content.detach().abs().sum(-1) == 0] = NUM_CLASSES
    blocked = torch.zeros(queries.attn_mask.shape).masked_fill(queries.attn_mask, float("-inf"))
    positives = [q for q, _ in queries.positive_indices(targets)]
    meta = {
        "dn_positive_idx": positives,
        "dn_num_group": queries.num_groups,
        "dn_num_split": [queries.content.shape[1], QUERIES],
    }

    def transformers_denoising(targets, num_classes, num_queries, class_embed, **kwargs):
        boxes = _modeling.inverse_sigmoid(queries.boxes.detach().to(class_embed.weight.dtype))
        return class_embed(labels), boxes, blocked, meta

    _modeling.get_contrastive_denoising_training_group = transformers_denoising


@pytest.fixture
def restore_denoising():
    original = _modeling.get_contrastive_denoising_training_group
    yield
    _modeling.get_contrastive_denoising_training_group = original


def transformers_labels(targets: list[dict[str, torch.Tensor]], dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    return [{"class_labels": t["labels"], "boxes": t["boxes"].to(dtype)} for t in targets]


def losses_in_transformers_names(losses: dict[str, torch.Tensor], weights: dict[str, float]) -> dict[str, torch.Tensor]:
    """Our unweighted ``loss_vfl{_i,_enc,_dn,_dn_i}`` -> transformers' weighted ``loss_vfl{,_aux_i,_dn_i}``."""
    renamed = {}
    for key, value in losses.items():
        match = re.match(r"^(loss_vfl|loss_bbox|loss_giou)(?:_(enc|dn|\d+))?(?:_(\d+))?$", key)
        if not match:
            continue
        name, part, index = match.groups()
        if part == "enc":
            suffix = f"_aux_{LAYERS - 1}"
        elif part == "dn":
            suffix = f"_dn_{index if index is not None else LAYERS - 1}"
        else:
            suffix = "" if part is None else f"_aux_{part}"
        renamed[name + suffix] = value * weights[name]
    return renamed


def training_step(ours: RTDETR, reference: nn.Module, dtype: torch.dtype):
    targets = rtdetr_targets()
    same_denoising(ours, targets)
    images, pixel_mask = images_and_mask(dtype)
    out = ours.train()(images, pixel_mask, targets)
    losses = ours.loss(out, targets)
    ref = reference.train()(images, pixel_mask=(~pixel_mask).long(), labels=transformers_labels(targets, dtype))
    return out, losses, ref


def test_training_outputs_and_loss_match_transformers(restore_denoising) -> None:
    """Training (BatchNorm on batch statistics, denoising queries): every layer's denoising and matching
    outputs, and each of the 3 * (2 * layers + 1) weighted terms of the loss (measured: within 1e-6)."""
    ours, reference, _ = ours_and_transformers()
    with torch.no_grad():
        out, losses, ref = training_step(ours, reference, torch.float32)
    split = out["dn_outputs"]["pred_logits"].shape[2]
    for layer in range(LAYERS):
        torch.testing.assert_close(
            out["dn_outputs"]["pred_logits"][layer], ref.intermediate_logits[:, layer, :split], rtol=0, atol=2e-5
        )
        torch.testing.assert_close(
            out["dn_outputs"]["pred_boxes"][layer],
            ref.intermediate_reference_points[:, layer, :split],
            rtol=0,
            atol=2e-5,
        )
    torch.testing.assert_close(out["pred_logits"], ref.logits[:, split:], rtol=0, atol=2e-5)
    renamed = losses_in_transformers_names(losses, {"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0})
    assert set(renamed) == set(ref.loss_dict) and len(renamed) == 3 * (2 * LAYERS + 1)
    for key, value in ref.loss_dict.items():
        torch.testing.assert_close(renamed[key], value, rtol=0, atol=1e-5, msg=key)
    torch.testing.assert_close(losses["loss"], ref.loss, rtol=0, atol=1e-5)


def test_gradients_match_transformers(restore_denoising) -> None:
    """Every parameter's gradient of the whole training loss in float64 (measured: within 3.3e-6 of each
    parameter's largest gradient, from the GIoU: torchvision's adds 1e-7 to the union, transformers'
    nothing; every loss term agrees to 1e-6). Gradients that are zero but for rounding are left out: a
    key's bias (the softmax ignores it) and the shifts that a BatchNorm on batch statistics removes
    downstream (the input projections' BatchNorm bias of the lower levels, the last AIFI norm's bias)."""
    ours, reference, _ = ours_and_transformers(torch.float64)
    out, losses, ref = training_step(ours, reference, torch.float64)
    losses["loss"].backward()
    ref.loss.backward()
    grads = to_transformers({n: p.grad for n, p in ours.named_parameters() if p.grad is not None})
    expected = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None and p.grad.abs().max() > 1e-12}
    assert (
        "model.encoder.aifi.0.layers.0.self_attn.q_proj.weight" in expected
        and "model.enc_score_head.weight" in expected
    )
    assert {n for n, g in grads.items() if g.abs().max() > 1e-12} == set(expected)
    assert len(expected) > 250
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-5 * scale, msg=name)


def test_registered_and_trains_on_images_without_objects() -> None:
    assert DETECTORS["rtdetr"].func is RTDETR and not DETECTORS["rtdetr"].keywords
    ours, _, _ = ours_and_transformers()
    images, pixel_mask = images_and_mask()
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    losses = ours.train().loss(ours(images, pixel_mask, empty), empty)
    assert torch.isfinite(losses["loss"]) and losses["loss_bbox"] == 0
    losses["loss"].backward()


def test_aifi_hides_padding_the_cropped_map_sees_the_same() -> None:
    """The top level's attention over a padded map, at its valid tokens, is the attention over the
    map cropped to them (the position embedding counts from the top-left corner either way)."""
    from vision_tx.heads.rtdetr import AIFI, AIFILayer

    torch.manual_seed(0)
    aifi = perturb_(AIFI(AIFILayer(16, 2, 24), 2)).eval().double()
    x = torch.randn(2, 16, 4, 5, dtype=torch.float64)
    padding = torch.zeros(2, 4, 5, dtype=torch.bool)
    padding[1, 3:, :] = True
    padding[1, :, 3:] = True
    with torch.no_grad():
        padded = aifi(x, padding)
        cropped = aifi(x[1:, :, :3, :3])
        torch.testing.assert_close(padded[1:, :, :3, :3], cropped, rtol=0, atol=1e-12)
        torch.testing.assert_close(padded[:1], aifi(x[:1]), rtol=0, atol=1e-12)


def test_look_forward_twice_trains_the_previous_layers_box_head() -> None:
    """The official RT-DETR's (transformers' port leaves it out): layer i's box is refined from layer
    i - 1's box with its gradient, so the last layer's box loss reaches the previous box head, not earlier ones."""
    for look_forward_twice, reached in ((True, [False, True, True]), (False, [False, False, True])):
        ours, _, _ = ours_and_transformers(look_forward_twice=look_forward_twice)
        images, pixel_mask = images_and_mask()
        ours.train()(images, pixel_mask, rtdetr_targets())["pred_boxes"].sum().backward()
        heads = ours.bbox_embed[:LAYERS]
        assert [bool(head.layers[-1].weight.grad.abs().sum() > 0) for head in heads] == reached, look_forward_twice


def test_denoising_queries_are_transformers_groups_as_the_decoder_reads_them() -> None:
    """RT-DETR's own denoising module against transformers' ``get_contrastive_denoising_training_group``
    with the same draws: the same labels, and the decoder's boxes equal to the sigmoid of its logits
    (stored through eps 1e-5, where DINO's 1e-3 would move the crossed corners' sizes)."""
    ours, reference, _ = ours_and_transformers()
    targets = rtdetr_targets()
    targets[0]["boxes"][0] = torch.tensor([0.04, 0.96, 0.3, 0.2])  # the noise crosses the image's edges
    torch.manual_seed(3)
    queries = ours.denoising(targets, QUERIES)
    torch.manual_seed(3)
    _, logit_boxes, mask, meta = _modeling.get_contrastive_denoising_training_group(
        transformers_labels(targets, torch.float32),
        NUM_CLASSES,
        QUERIES,
        reference.model.denoising_class_embed,
        DENOISING,
        label_noise_ratio=0.5,
        box_noise_scale=1.0,
    )
    assert queries.num_groups == meta["dn_num_group"] and torch.equal(queries.attn_mask, mask == -torch.inf)
    valid = queries.content.abs().sum(-1) > 0
    expected = logit_boxes.sigmoid()
    assert (expected[valid] < 1e-3).any()  # some size lies below DINO's eps: the eps matters
    torch.testing.assert_close(queries.boxes[valid], expected[valid], rtol=0, atol=1e-7)


def test_box_refinement_refines_the_last_layers_detached_boxes_from_the_finest_memory() -> None:
    """With ``box_refinement`` the detector's boxes are the refinement's of the last layer's boxes of the matching
    queries, without their gradient, read from the stride-8 memory and its valid ratios; the last layer's boxes become
    the last auxiliary output, and its logits score both; the denoising queries' last boxes are repeated."""
    torch.manual_seed(0)
    ours = RTDETR.build(
        MapsBackbone(backbone_maps()),
        NUM_CLASSES,
        num_queries=QUERIES,
        hidden_dim=DIM,
        num_heads=4,
        encoder_feedforward=48,
        num_decoder_layers=LAYERS,
        dim_feedforward=40,
        num_points=3,
        num_denoising=DENOISING,
        box_refinement=True,
    )
    perturb_(ours)
    images, pixel_mask = images_and_mask()
    pixel_mask[1, -16:] = True  # the second image padded at the bottom (two rows of the stride-8 map)
    seen = {}
    ours.box_refinement.register_forward_hook(lambda module, args, output: seen.update(args=args, output=output))
    outputs = ours.train()(images, pixel_mask, rtdetr_targets())
    boxes, finest, valid_ratio = seen["args"]
    last, split = outputs["aux_outputs"][-1], outputs["dn_outputs"]["pred_boxes"].shape[2]
    assert len(outputs["aux_outputs"]) == LAYERS and outputs["dn_outputs"]["pred_boxes"].shape[0] == LAYERS + 1
    torch.testing.assert_close(boxes, last["pred_boxes"], rtol=0, atol=0)
    torch.testing.assert_close(outputs["pred_boxes"], seen["output"], rtol=0, atol=0)
    assert split > 0
    torch.testing.assert_close(
        outputs["dn_outputs"]["pred_boxes"][-1], outputs["dn_outputs"]["pred_boxes"][-2], rtol=0, atol=0
    )
    torch.testing.assert_close(outputs["pred_logits"], last["pred_logits"], rtol=0, atol=0)
    assert (outputs["pred_boxes"] - last["pred_boxes"]).abs().min() > 0
    levels = ours.memory(ours.encoder(backbone_maps(), pixel_mask), pixel_mask)
    torch.testing.assert_close(finest.flatten(2).transpose(1, 2), levels.tokens[:, : MAP_SIZE[0] * MAP_SIZE[1]])
    torch.testing.assert_close(valid_ratio, torch.tensor([[1.0, 1.0], [1.0, 0.75]]), rtol=0, atol=0)
    (outputs["pred_boxes"].sum() + outputs["dn_outputs"]["pred_boxes"][-1].sum()).backward()
    assert all(head.layers[-1].weight.grad is None or not head.layers[-1].weight.grad.any() for head in ours.bbox_embed)
    assert ours.box_refinement.edges.layers[0].weight.grad.abs().sum() > 0


def test_memory_levels_and_proposal_anchors_name_each_tokens_pixel() -> None:
    """In a padded batch (the second image 40 x 72 of the 64 x 96 pixels) with a fourth level (stride 64), each level's
    valid ratio is the image's share of the pixels its cells cover (the backbone's strides, doubled per extra level),
    and each valid token's proposal anchor is centred on its pixel, ``(i + 0.5) * stride`` over the image's side."""
    torch.manual_seed(0)
    ours = RTDETR.build(
        MapsBackbone(backbone_maps()),
        NUM_CLASSES,
        num_queries=QUERIES,
        hidden_dim=DIM,
        num_heads=4,
        encoder_feedforward=48,
        num_decoder_layers=LAYERS,
        dim_feedforward=40,
        num_levels=4,
    ).eval()
    images, pixel_mask = images_and_mask()
    pixel_mask[1, 40:] = True
    pixel_mask[1, :, 72:] = True
    with torch.no_grad():
        levels = ours.memory(ours.encoder(backbone_maps(), pixel_mask), pixel_mask)
    assert levels.shapes == [(8, 12), (4, 6), (2, 3), (1, 2)]
    image = torch.tensor([[96.0, 64.0], [72.0, 40.0]])  # (w, h)
    for level, ((height, width), stride) in enumerate(zip(levels.shapes, (8, 16, 32, 64))):
        torch.testing.assert_close(
            levels.valid_ratios[:, level], image / torch.tensor([width * stride, height * stride])
        )
    logits, valid = proposal_anchors(levels)
    start = 0
    for (height, width), stride in zip(levels.shapes, (8, 16, 32, 64)):
        y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        pixels = (torch.stack([x, y], -1).flatten(0, 1).float() + 0.5) * stride  # [h*w, 2]
        centres = logits[:, start : start + height * width, :2].sigmoid()
        ok = valid[:, start : start + height * width]
        torch.testing.assert_close(centres[ok], (pixels[None] / image[:, None])[ok])
        start += height * width
    assert valid[1].sum() < valid[0].sum() and valid[1].any()


@pytest.mark.parametrize("solver", ["batched", "scipy"])
def test_training_forward_and_loss_on_a_gpu_read_no_value_back(solver: str) -> None:
    """The main job's network (ConvNeXt-toy under the rtdetr_toy size) trains its forward pass, denoising and loss on a
    GPU without waiting for the device, as a CUDA graph needs, with the batched matcher: run on fake CUDA tensors
    (shapes only, no GPU needed), where reading any value raises. scipy's matcher reads the costs: it must raise."""
    matcher = {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0, "focal_alpha": 0.25, "solver": solver}
    backbone = build_backbone("convnext_toy", out_indices=(1, 2, 3))
    model = RTDETR.build(backbone, 3, **{**RTDETR.variants["rtdetr_toy"], "matcher_kwargs": matcher}).train()
    params, real = dict(model.named_parameters()), model.state_dict()
    pixel_mask = torch.zeros(2, 160, 224, dtype=torch.bool)
    pixel_mask[1, :, 96:] = True  # the second image is narrower: its padding is masked at every level
    boxes = [torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]]), torch.tensor([[0.5, 0.5, 0.4, 0.4]])]
    with FakeTensorMode() as mode:
        state = {name: mode.from_tensor(value).cuda().requires_grad_(name in params) for name, value in real.items()}
        images, pixel_mask = torch.randn(2, 3, 160, 224, device="cuda"), mode.from_tensor(pixel_mask).cuda()
        targets = [
            {"labels": torch.tensor([0, 2], device="cuda"), "boxes": mode.from_tensor(boxes[0]).cuda()},
            {"labels": torch.tensor([1], device="cuda"), "boxes": mode.from_tensor(boxes[1]).cuda()},
        ]
        if solver == "scipy":
            with pytest.raises(DataDependentOutputException):
                model.loss(functional_call(model, state, (images, pixel_mask, targets)), targets)
            return
        losses = model.loss(functional_call(model, state, (images, pixel_mask, targets)), targets)
    assert losses["loss"].shape == () and losses["loss"].device.type == "cuda"
    assert any(name.startswith("loss_bbox_dn") for name in losses)  # the denoising queries were in the step

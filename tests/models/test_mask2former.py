"""Mask2Former against transformers' Mask2FormerForUniversalSegmentation on the same backbone maps and
(perturbed) weights, in float64: the pixel decoder's outputs, every decoder prediction, the set loss
with the same random points (one seed for both sides), and the gradients of every weight."""

from __future__ import annotations

import re
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests.conftest import require_reference
from tests.parity import perturb_
from vision_tx.heads.mask2former import Mask2FormerCriterion
from vision_tx.models.mask2former import Mask2Former, semantic_targets

transformers = require_reference("transformers")

# transformers' decoder_layers counts the prediction before the first layer: 5 = 4 layers, so that the rounds
# over the 3 levels wrap around.
NUM_CLASSES, DIM, QUERIES, DECODER_LAYERS, ENCODER_LAYERS = 5, 64, 10, 5, 2
CHANNELS = (16, 32, 64, 128)  # strides 4, 8, 16, 32 (the channels of transformers' Swin with embed_dim 16)
IMAGE_SIZE = (64, 96)

# vision_tx name -> transformers name, applied in order (self-attention q/k/v rows are split separately).
_TO_TRANSFORMERS = [
    (r"^pixel_decoder\.projection\.input_proj\.", "model.pixel_level_module.decoder.input_projections."),
    (r"^pixel_decoder\.projection\.level_embed$", "model.pixel_level_module.decoder.level_embed"),
    (r"^pixel_decoder\.lateral_convs\.(\d+)\.", lambda m: f"model.pixel_level_module.decoder.adapter_{int(m[1]) + 1}."),
    (r"^pixel_decoder\.output_convs\.(\d+)\.", lambda m: f"model.pixel_level_module.decoder.layer_{int(m[1]) + 1}."),
    (r"^pixel_decoder\.mask_features\.", "model.pixel_level_module.decoder.mask_projection."),
    (r"^pixel_decoder\.encoder\.", "model.pixel_level_module.decoder.encoder."),
    (r"(encoder\.layers\.\d+)\.norm1\.", r"\1.self_attn_layer_norm."),
    (r"\.ffn\.linear(\d)\.", r".fc\1."),
    (r"\.ffn\.norm\.", ".final_layer_norm."),
    (r"^predictor\.level_embed\.", "model.transformer_module.level_embed."),
    (r"^predictor\.query_feat\.", "model.transformer_module.queries_features."),
    (r"^predictor\.query_embed\.", "model.transformer_module.queries_embedder."),
    (r"^predictor\.layers\.", "model.transformer_module.decoder.layers."),
    (r"(decoder\.layers\.\d+)\.norm1\.", r"\1.cross_attn_layer_norm."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.self_attn_layer_norm."),
    (r"^predictor\.decoder_norm\.", "model.transformer_module.decoder.layernorm."),
    (r"^predictor\.mask_embed\.layers\.(\d)\.", r"model.transformer_module.decoder.mask_predictor.mask_embedder.\1.0."),
    (r"^predictor\.class_embed\.", "class_predictor."),
]


def to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    converted = {}
    for key, value in state.items():
        for pattern, replacement in _TO_TRANSFORMERS:
            key = re.sub(pattern, replacement, key)
        if ".self_attn.in_proj_" in key:
            prefix, kind = key.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                converted[f"{prefix}.{name}.{kind}"] = part
        else:
            converted[key] = value
    return converted


class MapsBackbone(nn.Module):
    """Returns the given maps whatever the images: both models read the same backbone features."""

    def __init__(self, maps: list[torch.Tensor]) -> None:
        super().__init__()
        self.maps = maps
        self.out_channels = [m.shape[1] for m in maps]

    def forward(self, images: torch.Tensor) -> OrderedDict:
        return OrderedDict((f"res{i + 2}", m) for i, m in enumerate(self.maps))


def blob_masks(count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` random rectangles (bool ``[count, H, W]``) at the image size."""
    height, width = IMAGE_SIZE
    masks = torch.zeros(count, height, width, dtype=torch.bool)
    for mask in masks:
        y0, x0 = (
            int(torch.randint(0, height - 8, (1,), generator=generator)),
            int(torch.randint(0, width - 8, (1,), generator=generator)),
        )
        y1 = y0 + 4 + int(torch.randint(0, height - y0 - 4, (1,), generator=generator))
        x1 = x0 + 4 + int(torch.randint(0, width - x0 - 4, (1,), generator=generator))
        mask[y0:y1, x0:x1] = True
    return masks


@pytest.fixture(scope="module")
def inputs():
    generator = torch.Generator().manual_seed(3)
    maps = [
        torch.randn(2, c, IMAGE_SIZE[0] // s, IMAGE_SIZE[1] // s, generator=generator, dtype=torch.float64)
        for c, s in zip(CHANNELS, (4, 8, 16, 32))
    ]
    targets = [
        {"labels": torch.tensor([1, 3, 0]), "masks": blob_masks(3, generator)},
        {"labels": torch.tensor([4, 4]), "masks": blob_masks(2, generator)},
    ]
    return maps, targets


def ours_and_transformers(maps: list[torch.Tensor], **overrides) -> tuple[Mask2Former, nn.Module]:
    """Our Mask2Former with moved weights and transformers' loaded from it (float64, eval mode)."""
    torch.manual_seed(0)
    kwargs = dict(
        num_queries=QUERIES,
        hidden_dim=DIM,
        mask_dim=DIM,
        num_heads=4,
        num_decoder_layers=DECODER_LAYERS - 1,
        dim_feedforward=80,
        num_encoder_layers=ENCODER_LAYERS,
        encoder_dim_feedforward=96,
    )
    ours = Mask2Former(MapsBackbone(maps), NUM_CLASSES, **{**kwargs, **overrides}).eval()
    perturb_(ours)
    config = transformers.Mask2FormerConfig(
        backbone_config=transformers.SwinConfig(
            embed_dim=16,
            depths=[1, 1, 1, 1],
            num_heads=[1, 1, 1, 1],
            out_features=["stage1", "stage2", "stage3", "stage4"],
        ),
        feature_size=DIM,
        mask_feature_size=DIM,
        hidden_dim=DIM,
        encoder_feedforward_dim=96,
        encoder_layers=ENCODER_LAYERS,
        decoder_layers=DECODER_LAYERS,
        num_attention_heads=4,
        dim_feedforward=80,
        num_queries=QUERIES,
        num_labels=NUM_CLASSES,
        dropout=0.0,
        train_num_points=300,
        output_auxiliary_logits=True,
    )
    reference = transformers.Mask2FormerForUniversalSegmentation(config).eval()
    state = to_transformers(ours.state_dict())
    backbone_keys = {k for k in reference.state_dict() if k.startswith("model.pixel_level_module.encoder.")}
    assert set(state) == set(reference.state_dict()) - backbone_keys - {"criterion.empty_weight"}
    reference.load_state_dict(state, strict=False)
    reference.model.pixel_level_module.encoder.forward = lambda pixel_values, *args, **kw: SimpleNamespace(
        feature_maps=tuple(maps)
    )
    return ours.double(), reference.double()


@pytest.fixture(scope="module")
def models(inputs):
    return ours_and_transformers(inputs[0])


def test_pixel_decoder_and_every_prediction_match_transformers(models, inputs) -> None:
    ours, reference = models
    maps, _ = inputs
    images = torch.zeros(2, 3, *IMAGE_SIZE, dtype=torch.float64)
    with torch.no_grad():
        mask_features, levels = ours.pixel_decoder(maps)
        out = ours(images)
        expected = reference(images, output_hidden_states=True)
    # Measured: 1.8e-15 (pixel decoder), 1.3e-15 (class logits), 4.9e-15 (mask logits of magnitude up to 5).
    torch.testing.assert_close(mask_features, expected.pixel_decoder_last_hidden_state, rtol=0, atol=1e-13)
    assert len(levels) == len(expected.pixel_decoder_hidden_states) == 3
    for level, reference_level in zip(levels, expected.pixel_decoder_hidden_states):
        torch.testing.assert_close(level, reference_level, rtol=0, atol=1e-13)
    predictions = [*out["aux_outputs"], out]
    reference_predictions = [
        *expected.auxiliary_logits,
        {"class_queries_logits": expected.class_queries_logits, "masks_queries_logits": expected.masks_queries_logits},
    ]
    assert len(predictions) == len(reference_predictions) == DECODER_LAYERS
    for prediction, reference_prediction in zip(predictions, reference_predictions):
        torch.testing.assert_close(
            prediction["pred_logits"], reference_prediction["class_queries_logits"], rtol=0, atol=1e-13
        )
        torch.testing.assert_close(
            prediction["pred_masks"], reference_prediction["masks_queries_logits"], rtol=0, atol=1e-13
        )


def test_masked_attention_restricts_each_query(models, inputs) -> None:
    """The masks of the first prediction decide where layer 1's cross-attention looks: changing the
    memory outside a query's foreground leaves that query's attention output unchanged."""
    ours, _ = models
    maps, _ = inputs
    with torch.no_grad():
        mask_features, levels = ours.pixel_decoder(maps)
        predictor = ours.predictor
        batch = maps[0].shape[0]
        queries = predictor.query_feat.weight.expand(batch, -1, -1)
        query_pos = predictor.query_embed.weight.expand(batch, -1, -1)
        first = predictor.predict(queries, mask_features)
        blocked = predictor.attention_mask(first["pred_masks"], levels[0].shape[-2:])
        memory = predictor.input_proj[0](levels[0]).flatten(2).transpose(1, 2) + predictor.level_embed.weight[0]
        attention = predictor.layers[0].cross_attn
        before = attention(queries + query_pos, memory, memory, attn_mask=blocked)
        image, query = (blocked.sum(-1) > 0).nonzero()[0].tolist()
        changed = memory.clone()
        changed[image, blocked[image, query]] += 5.0
        after = attention(queries + query_pos, changed, changed, attn_mask=blocked)
    assert blocked[image, query].sum() > 0
    torch.testing.assert_close(after[image, query], before[image, query], rtol=0, atol=1e-12)
    assert not torch.allclose(after[image], before[image])  # other queries do see the change
    # A query whose previous mask has no foreground at this level attends everywhere (none of it blocked).
    empty = torch.full((1, 2, 8, 8), -1.0, dtype=torch.float64)
    empty[0, 1, :4] = 1.0
    blocked = predictor.attention_mask(empty, (4, 4))
    assert not blocked[0, 0].any() and blocked[0, 1].sum() == 8


def _their_loss(reference, images, targets):
    mask_labels = [t["masks"].double() for t in targets]
    class_labels = [t["labels"] for t in targets]
    return reference(images, mask_labels=mask_labels, class_labels=class_labels)


def test_loss_and_gradients_match_transformers(inputs) -> None:
    maps, targets = inputs
    maps = [m.clone().requires_grad_() for m in maps]
    ours, reference = ours_and_transformers(maps)
    ours.criterion = Mask2FormerCriterion(NUM_CLASSES, num_points=300)
    images = torch.zeros(2, 3, *IMAGE_SIZE, dtype=torch.float64)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # transformers draws its points in the default dtype
    try:
        torch.manual_seed(7)
        losses = ours.loss(ours(images), targets)
        ours_grads = torch.autograd.grad(losses["loss"], [*ours.parameters(), *maps], allow_unused=True)
        torch.manual_seed(7)
        expected = _their_loss(reference, images, targets)
        names = [n for n, _ in reference.named_parameters() if not n.startswith("model.pixel_level_module.encoder.")]
        params = dict(reference.named_parameters())
        their_grads = torch.autograd.grad(expected.loss, [params[n] for n in names] + maps, allow_unused=True)
    finally:
        torch.set_default_dtype(default)
    # Measured: 7e-15 of 45.3 (loss; another seed moves it by 3e-2), 1.3e-15 (weights' gradients), 5e-17 (maps').
    torch.testing.assert_close(losses["loss"], expected.loss, rtol=1e-13, atol=0)
    their_by_name = dict(zip(names, their_grads[: len(names)]))
    ours_by_name = to_transformers({n: g for (n, _), g in zip(ours.named_parameters(), ours_grads)})
    assert set(ours_by_name) == set(their_by_name)
    for name, grad in ours_by_name.items():
        torch.testing.assert_close(grad, their_by_name[name], rtol=0, atol=1e-13, msg=name)
    for ours_grad, their_grad in zip(ours_grads[-len(maps) :], their_grads[-len(maps) :]):
        torch.testing.assert_close(ours_grad, their_grad, rtol=0, atol=1e-14)


def test_loss_divides_by_the_mask_count_of_the_whole_distributed_batch(inputs, monkeypatch) -> None:
    """Under DDP the mask and dice terms are sums over this process's matched masks divided by the
    masks per process of the whole batch, which need not be this process's count: both sides given
    2.5 (this batch has another count) give the same loss."""
    maps, targets = inputs
    assert sum(len(t["labels"]) for t in targets) != 2.5
    monkeypatch.setattr(
        "vision_tx.heads.mask2former.criterion.num_boxes_in_batch", lambda *args, **kwargs: torch.tensor(2.5)
    )
    modeling = require_reference("transformers.models.mask2former.modeling_mask2former")
    monkeypatch.setattr(modeling.Mask2FormerLoss, "get_num_masks", lambda *args, **kwargs: torch.tensor(2.5))
    ours, reference = ours_and_transformers(maps)
    ours.criterion = Mask2FormerCriterion(NUM_CLASSES, num_points=300)
    images = torch.zeros(2, 3, *IMAGE_SIZE, dtype=torch.float64)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # transformers draws its points in the default dtype
    try:
        with torch.no_grad():
            torch.manual_seed(7)
            losses = ours.loss(ours(images), targets)
            torch.manual_seed(7)
            expected = _their_loss(reference, images, targets)
    finally:
        torch.set_default_dtype(default)
    torch.testing.assert_close(losses["loss"], expected.loss, rtol=1e-13, atol=0)


def test_semantic_targets_one_mask_per_present_class() -> None:
    labels = torch.tensor([[[0, 0, 255], [2, 2, 0]]])
    (target,) = semantic_targets(labels)
    assert target["labels"].tolist() == [0, 2]
    assert target["masks"].tolist() == [
        [[True, True, False], [False, False, True]],
        [[False, False, False], [True, True, False]],
    ]

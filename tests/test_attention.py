"""Attention maps: weights recorded through F.scaled_dot_product_attention, rollout by hand, DETR cross-attention,
DINO's deformable cross-attention drawn at its sampling points."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.attention import attention_rollout, attention_weights, patch_grid, record_attention, vit_attention_maps


class TinyAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class TinyViT(nn.Module):
    """Two pre-norm attention layers over a class token and 2x2 patches of 4x4 pixels."""

    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2))
        self.layers = nn.ModuleList(TinyAttention(dim, heads) for _ in range(2))
        self.head = nn.Linear(dim, 3)

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.tokens(images)
        for norm, layer in zip(self.norms, self.layers):
            x = x + layer(norm(x))
        return self.head(x[:, 0])


def weights_by_hand(layer: TinyAttention, x: torch.Tensor) -> torch.Tensor:
    """``[B, heads, N, N]`` from the layer's parameters, one head at a time."""
    dim = x.shape[-1]
    head_dim = dim // layer.heads
    w, b = layer.qkv.weight, layer.qkv.bias
    out = []
    for h in range(layer.heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        q = x @ w[:dim][rows].T + b[:dim][rows]
        k = x @ w[dim : 2 * dim][rows].T + b[dim : 2 * dim][rows]
        out.append(torch.softmax(q @ k.transpose(1, 2) / head_dim**0.5, -1))
    return torch.stack(out, 1)


def test_rollout_of_a_two_layer_two_head_model_is_the_computation_by_hand() -> None:
    torch.manual_seed(0)
    model = TinyViT().double().eval()
    with torch.no_grad():
        for p in model.parameters():  # every parameter away from its initialisation
            p.add_(0.3 * torch.randn_like(p))
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with record_attention({"0": model.layers[0], "1": model.layers[1]}) as records:
        logits = model(images)
    torch.testing.assert_close(logits, TinyViT.forward(model, images))  # recording leaves the outputs alone

    with torch.no_grad():
        x = model.tokens(images)
        a1 = weights_by_hand(model.layers[0], model.norms[0](x))
        x = x + model.layers[0](model.norms[0](x))
        a2 = weights_by_hand(model.layers[1], model.norms[1](x))
    torch.testing.assert_close(records["0"][0].double(), a1, rtol=0, atol=1e-6)
    torch.testing.assert_close(records["1"][0].double(), a2, rtol=0, atol=1e-6)

    # By hand: heads averaged, 0.5 I + 0.5 A (rows already sum to 1), then layer 2 times layer 1.
    n = a1.shape[-1]
    r1 = 0.5 * torch.eye(n, dtype=torch.float64) + 0.5 * (a1[:, 0] + a1[:, 1]) / 2
    r2 = 0.5 * torch.eye(n, dtype=torch.float64) + 0.5 * (a2[:, 0] + a2[:, 1]) / 2
    expected = torch.einsum("bij,bjk->bik", r2, r1)
    torch.testing.assert_close(attention_rollout([a1, a2]).double(), expected, rtol=0, atol=1e-12)
    assert not torch.allclose(attention_rollout([a2, a1]).double(), expected)  # the order of the layers matters
    # Another residual share: 0.3 I + 0.7 A.
    s1, s2 = (0.3 * torch.eye(n, dtype=torch.float64) + 0.7 * a.mean(1) for a in (a1, a2))
    torch.testing.assert_close(attention_rollout([a1, a2], residual=0.3).double(), s2 @ s1, rtol=0, atol=1e-12)

    maps = vit_attention_maps(model.float(), images.float())
    assert maps["rollout"].shape == (2, 2, 2) and maps["last_layer"].shape == (2, 2, 2, 2)
    class_row = expected[:, 0, 1:]
    torch.testing.assert_close(
        maps["rollout"].flatten(1).double(), class_row / class_row.sum(-1, keepdim=True), rtol=0, atol=1e-5
    )
    last = a2[:, :, 0, 1:]
    torch.testing.assert_close(
        maps["last_layer"].flatten(2).double(), last / last.sum(-1, keepdim=True), rtol=0, atol=1e-5
    )


def test_attention_weights_follow_the_masks_of_sdpa() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    mask = torch.tensor([True, True, False, True, False])[None, None, None]
    for attn_mask in (None, mask, torch.randn(1, 1, 5, 5)):
        weights = attention_weights(q, k, attn_mask)
        torch.testing.assert_close(weights @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask))
    assert (attention_weights(q, k, mask)[..., ~mask[0, 0, 0]] == 0).all()
    torch.testing.assert_close(
        attention_weights(q, k, is_causal=True) @ v, F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_patch_grid() -> None:
    assert patch_grid(1 + 14 * 14, (224, 224)) == (1, 14, 14)
    assert patch_grid(2 + 24 * 32, (384, 512)) == (2, 24, 32)
    assert patch_grid(4 + 16, (64, 64), num_prefix_tokens=4) == (4, 4, 4)


def test_pictures_for_a_classifier_and_a_detector(tmp_path) -> None:
    from types import SimpleNamespace

    from vision_tx.attention import classifier_attention_pictures
    from vision_tx.data.imagefolder import val_transforms
    from vision_tx.data.transforms import DetrValTransform
    from vision_tx.lightning.detection import DetectionModule

    torch.manual_seed(0)
    image = torch.randint(0, 256, (3, 40, 48), dtype=torch.uint8)
    pictures = classifier_attention_pictures(TinyViT().eval(), image, val_transforms(8, 1.0))
    assert len(pictures) == 1 + 1 + 2 and all(p.shape == (3, 8, 8) and p.dtype == torch.uint8 for p in pictures)

    detr = {
        "num_queries": 5,
        "hidden_dim": 32,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "dim_feedforward": 64,
    }
    detector = DetectionModule(
        num_classes=4,
        backbone_kwargs={"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 2, 4, 8]},
        detector_kwargs=detr,
    )
    detector.configure_model()
    detector.eval()
    datamodule = SimpleNamespace(
        val_transform=DetrValTransform(size=64, max_size=96), category_names={1: "a", 2: "b", 3: "c"}
    )
    pictures = detector.attention_pictures(image, datamodule, score_threshold=2.0)  # none above: the 4 best
    assert len(pictures) == 1 + 4 and pictures[0].shape[0] == 3


def test_detr_cross_attention_is_torchs_head_averaged_attention() -> None:
    """The last decoder layer's cross-attention map against ``nn.MultiheadAttention``'s weights (averaged
    over heads) on the same inputs and weights."""
    from tests.parity import perturb_
    from vision_tx.lightning.detection import DetectionModule

    torch.manual_seed(0)
    detr = {
        "num_queries": 5,
        "hidden_dim": 32,
        "num_heads": 4,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "dim_feedforward": 64,
    }
    detector = DetectionModule(
        num_classes=4,
        backbone_kwargs={"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 2, 4, 8]},
        detector_kwargs=detr,
    )
    detector.configure_model()
    model = perturb_(detector.model).eval()
    cross = model.transformer.decoder.layers[-1].cross_attn
    inputs = []
    cross.register_forward_hook(lambda _module, args, _output: inputs.append(args))
    images, pixel_mask = torch.randn(2, 3, 64, 96), torch.zeros(2, 64, 96, dtype=torch.bool)
    pixel_mask[1, :, 64:] = True
    result = model.cross_attention(images, pixel_mask)
    query, key, value, padding_mask = inputs[-1]
    reference = nn.MultiheadAttention(32, 4, batch_first=True)
    reference.load_state_dict(cross.state_dict())
    with torch.no_grad():
        _, expected = reference(
            query, key, value, key_padding_mask=padding_mask, need_weights=True, average_attn_weights=True
        )
    assert padding_mask.any() and result["attention"].shape == (2, 5, 2, 3)
    torch.testing.assert_close(result["attention"].flatten(2), expected, rtol=0, atol=2e-7)  # measured 3e-8 (of ~0.3)


def test_splat_is_the_adjoint_of_grid_sample() -> None:
    """Drawing weighted points on a grid is the transpose of reading the grid at those points: cell (i, j)
    of the drawing equals the weighted sum of what ``grid_sample`` (bilinear, zero padding,
    ``align_corners=False``) reads at the points from the one-hot map of that cell."""
    from vision_tx.attention import splat_bilinear

    torch.manual_seed(0)
    height, width = 5, 7
    locations = torch.rand(3, 40, 2, dtype=torch.float64) * 1.4 - 0.2  # some points outside, some on the border
    weights = torch.rand(3, 40, dtype=torch.float64)
    one_hot = torch.eye(height * width, dtype=torch.float64).view(1, height * width, height, width)
    read = F.grid_sample(one_hot, (2 * locations - 1)[None], mode="bilinear", padding_mode="zeros", align_corners=False)
    expected = (read[0] * weights).sum(-1).T.reshape(3, height, width)  # [cells, 3, 40] -> [3, h, w]
    drawn = splat_bilinear(locations, weights, (height, width))
    assert (locations < 0).any() and (locations > 1).any()
    torch.testing.assert_close(drawn, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["dino", "rtdetr"])  # RT-DETR's decoder is DINO's
def test_dino_cross_attention_draws_the_last_layers_sampling_weights_per_query(name: str) -> None:
    """Each query's map is its last decoder layer's sampling weights averaged over heads: read back at
    the sampling points of the finest level, a map reads what ``grid_sample`` reads there, weighted;
    and the pictures show the input and the 4 best queries."""
    from types import SimpleNamespace

    from tests.parity import perturb_
    from vision_tx.data.transforms import DetrValTransform
    from vision_tx.lightning.detection import DetectionModule

    torch.manual_seed(0)
    dino = {
        "num_queries": 5,
        "hidden_dim": 32,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 2,
        "dim_feedforward": 64,
        "num_denoising": 0,
    }
    detector = DetectionModule(
        num_classes=4,
        detector=name,
        detector_kwargs=dino,
        backbone_kwargs={"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 2, 4, 8]},
    )
    detector.configure_model()
    model = perturb_(detector.model).eval()
    cross = model.decoder.layers[-1].cross_attn
    inputs = []
    cross.register_forward_hook(lambda _module, args, _output: inputs.append(args))
    result = model.cross_attention(torch.randn(1, 3, 64, 96))
    query, reference, _, shapes = inputs[-1][:4]
    with torch.no_grad():
        locations, weights = cross.sampling(query, reference, shapes)
    attention = result["attention"]
    assert attention.shape == (1, 5, *shapes[0]) and len(inputs) == 1
    probe = torch.randn(1, 1, *shapes[0])
    # What each head reads from ``probe`` at its points, weighted, averaged over heads (all levels' points drawn on the
    # finest grid).
    read = F.grid_sample(
        probe, (2 * locations[0].flatten(1, -2) - 1)[None], align_corners=False
    )  # [1, 1, queries, points]
    expected = (read.view(5, -1) * weights[0].flatten(1)).sum(-1) / cross.num_heads
    torch.testing.assert_close((attention[0] * probe[0]).sum((-2, -1)), expected, rtol=0, atol=1e-5)

    image = torch.randint(0, 256, (3, 40, 48), dtype=torch.uint8)
    datamodule = SimpleNamespace(
        val_transform=DetrValTransform(size=64, max_size=96), category_names={1: "a", 2: "b", 3: "c"}
    )
    pictures = detector.eval().attention_pictures(image, datamodule, score_threshold=2.0)  # none above: the 4 best
    assert len(pictures) == 1 + 4 and all(p.shape[0] == 3 for p in pictures)

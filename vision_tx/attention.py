"""Attention maps: the weights of any attention computed with ``F.scaled_dot_product_attention``,
attention rollout (Abnar & Zuidema, 2020) and class-token maps for ViT/DeiT, and pictures of a
detector's cross-attention per detected object (the detector draws its own: ``model.cross_attention``,
e.g. DETR's as the DETR paper's figure, DINO's deformable one at its sampling points, with
:func:`splat_bilinear`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def attention_weights(
    q: Tensor, k: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """``softmax(q k^T * scale + mask)`` in fp32, as ``F.scaled_dot_product_attention`` weighs the values:
    ``q [..., Lq, d]``, ``k [..., Lk, d]``, ``attn_mask [..., Lq, Lk]`` (broadcast; bool, True: attend, or additive),
    ``is_causal`` (masks the keys after each query), ``scale`` (``d ** -0.5`` when None) -> ``[..., Lq, Lk]``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask.float()
        )
    return scores.softmax(-1)


@contextlib.contextmanager
def record_attention(modules: Mapping[str, nn.Module]) -> Iterator[dict[str, list[Tensor]]]:
    """Within the block, every ``F.scaled_dot_product_attention`` call made while one of ``modules``
    runs its forward is computed explicitly and its weights ``[B, heads, Lq, Lk]`` (fp32, detached)
    are appended to the list of that module's name (the innermost module when they nest).

    Works on any attention module that calls ``torch.nn.functional.scaled_dot_product_attention``
    (as ``F.scaled_dot_product_attention``); use it in eval mode (no attention dropout).
    """
    records: dict[str, list[Tensor]] = {name: [] for name in modules}
    running: list[str] = []
    original = F.scaled_dot_product_attention

    def explicit(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        **kwargs: Any,
    ) -> Tensor:
        if not running:
            return original(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs
            )
        if dropout_p:
            raise RuntimeError("record_attention: attention dropout is on; put the model in eval mode")
        weights = attention_weights(q, k, attn_mask, is_causal, scale)
        records[running[-1]].append(weights.detach())
        return weights.to(v.dtype) @ v

    def leave(_module: nn.Module, _args: Any, _output: Any) -> None:
        running.pop()

    handles = []
    for name, module in modules.items():
        handles.append(module.register_forward_pre_hook(lambda _m, _a, name=name: running.append(name) and None))
        handles.append(module.register_forward_hook(leave))
    F.scaled_dot_product_attention = explicit
    try:
        yield records
    finally:
        F.scaled_dot_product_attention = original
        for handle in handles:
            handle.remove()


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The innermost modules of ``model`` whose class name ends in ``Attention``, in order."""
    found = {name: m for name, m in model.named_modules() if type(m).__name__.endswith("Attention")}
    return {name: m for name, m in found.items() if not any(other.startswith(f"{name}.") for other in found)}


def attention_rollout(attentions: Sequence[Tensor], residual: float = 0.5) -> Tensor:
    """Attention rollout: ``attentions`` ``[B, heads, N, N]`` per layer (first to last) -> ``[B, N, N]``, row ``i`` the
    share of each input token in output token ``i``.

    Each layer's heads are averaged, the residual connection added as ``residual * I + (1 - residual) * A``
    with rows renormalised, and the layers multiplied: ``R = A_L ... A_2 A_1``.
    """
    rollout = None
    for layer in attentions:
        mixed = layer.to(torch.promote_types(layer.dtype, torch.float32)).mean(1)
        eye = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        mixed = residual * eye + (1 - residual) * mixed
        mixed = mixed / mixed.sum(-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    if rollout is None:
        raise ValueError("attention_rollout: no attention layers")
    return rollout


def patch_grid(
    num_tokens: int, image_size: tuple[int, int], num_prefix_tokens: int | None = None
) -> tuple[int, int, int]:
    """``(prefix tokens, grid height, grid width)`` of a ViT's ``num_tokens`` on an ``image_size`` input:
    ``num_prefix_tokens`` (class, distillation) if given, else the first of 1, 2, 0 for which the rest
    form a grid of square patches that tile the image."""
    height, width = image_size
    for prefix in (num_prefix_tokens,) if num_prefix_tokens is not None else (1, 2, 0):
        patches = num_tokens - prefix
        if patches <= 0:
            continue
        patch = math.sqrt(height * width / patches)
        grid = (round(height / patch), round(width / patch))
        if grid[0] * grid[1] == patches:
            return prefix, *grid
    raise ValueError(f"{num_tokens} tokens do not form a patch grid of a {height}x{width} image")


@torch.no_grad()
def vit_attention_maps(model: nn.Module, images: Tensor, residual: float = 0.5) -> dict[str, Tensor]:
    """For a ViT/DeiT classifier ``model`` and normalised ``images [B,3,H,W]``: ``logits [B,classes]``, ``rollout``
    ``[B,h,w]`` (the class token's row of :func:`attention_rollout` with ``residual`` over the patches) and
    ``last_layer`` ``[B,heads,h,w]`` (the last layer's class-token attention per head), each map summing to 1 over
    the patches it covers. The prefix tokens are ``model.num_prefix_tokens`` when the model says so."""
    modules = attention_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention modules (classes named *Attention)")
    with record_attention(modules) as records:
        logits = model(images)
    layers = [weights for name in modules for weights in records[name]]
    if not layers:
        raise ValueError(f"{type(model).__name__}: its attention modules do not call F.scaled_dot_product_attention")
    if any(layer.shape[-1] != layers[0].shape[-1] for layer in layers):
        raise ValueError(
            "attention rollout needs one token set through all layers (a plain ViT), not windows or stages"
        )
    prefix, grid_h, grid_w = patch_grid(
        layers[0].shape[-1], images.shape[-2:], getattr(model, "num_prefix_tokens", None)
    )
    if prefix == 0:
        raise ValueError("the model has no class token to follow")
    rollout = attention_rollout(layers, residual)[:, 0, prefix:]
    last = layers[-1][:, :, 0, prefix:]
    return {
        "logits": logits,
        "rollout": (rollout / rollout.sum(-1, keepdim=True)).unflatten(-1, (grid_h, grid_w)),
        "last_layer": (last / last.sum(-1, keepdim=True)).unflatten(-1, (grid_h, grid_w)),
    }


def splat_bilinear(locations: Tensor, weights: Tensor, size: tuple[int, int]) -> Tensor:
    """Weighted points drawn on an ``h x w`` grid, each spread over its four nearest cells with the
    weights bilinear sampling (``grid_sample``, ``align_corners=False``) would read them with: the adjoint
    of that sampling. ``locations [N,K,2]`` (x, y) in [0, 1] of the grid, ``weights [N,K]``, ``size`` (h, w)
    -> ``[N,h,w]``; points outside the grid leave part or all of their weight out."""
    height, width = size
    x = locations[..., 0] * width - 0.5
    y = locations[..., 1] * height - 0.5
    x0, y0 = x.floor(), y.floor()
    grid = weights.new_zeros(len(weights), height * width)
    for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
        cx, cy = x0 + dx, y0 + dy
        share = (1 - (x - cx).abs()) * (1 - (y - cy).abs()) * weights
        inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height)
        index = (cy.clamp(0, height - 1) * width + cx.clamp(0, width - 1)).long()
        grid.scatter_add_(1, index, share * inside)
    return grid.view(-1, height, width)


def classifier_attention_pictures(model: nn.Module, image: Tensor, transform: Any) -> list[Tensor]:
    """Pictures ``[3,H,W]`` uint8 of a ViT/DeiT classifier ``model``'s attention on ``image`` ``[3,H,W]`` uint8 after
    ``transform`` (the validation one): the input, the rollout and the last layer's class-token attention of each
    head."""
    from torchvision import tv_tensors

    from vision_tx.visualize import denormalize, overlay_heatmap

    inputs = transform(tv_tensors.Image(image))
    maps = vit_attention_maps(model, inputs[None].to(next(model.parameters()).device))
    shown = denormalize(inputs)
    return [
        shown,
        overlay_heatmap(shown, maps["rollout"][0]),
        *(overlay_heatmap(shown, m) for m in maps["last_layer"][0]),
    ]


def detector_attention_pictures(
    model: nn.Module,
    image: Tensor,
    transform: Any,
    category_names: Mapping[int, str] | None = None,
    score_threshold: float = 0.7,
) -> list[Tensor]:
    """Pictures ``[3,H,W]`` uint8 of a detector ``model``'s cross-attention on ``image`` ``[3,H,W]`` uint8 after
    ``transform`` (the validation one, on an image and its target): the input, then each object scored above
    ``score_threshold`` (the 4 best when none is) with its box, its name from ``category_names`` (label -> name;
    numbers when None) and the map ``model.cross_attention`` draws for it."""
    from torchvision import tv_tensors

    from vision_tx.visualize import denormalize, draw_detections, overlay_heatmap

    device = next(model.parameters()).device
    height, width = image.shape[-2:]
    target = {"boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(height, width))}
    inputs, _ = transform(tv_tensors.Image(image), target)
    result = model.cross_attention(inputs[None].to(device))
    shown = denormalize(inputs)
    detection = model.postprocess_per_query(result["outputs"], torch.tensor([inputs.shape[-2:]], device=device))[0]
    keep = (detection["scores"] >= score_threshold).nonzero()[:, 0]
    if not len(keep):
        keep = detection["scores"].topk(min(4, len(detection["scores"]))).indices
    return [
        shown,
        *(
            draw_detections(
                overlay_heatmap(shown, result["attention"][0, q]),
                **{k: v[q : q + 1].cpu() for k, v in detection.items()},
                category_names=category_names,
                score_threshold=0.0,
            )
            for q in keep.tolist()
        ),
    ]

"""Planted bugs in what the tools draw and predict: attention maps, tiled prediction (see ``tests/mutants/__init__.py``)."""

from tests.mutants.mutant import Mutant
from tests.mutants.targets import ATTN_WEIGHTS, DETR_ATTN, DINO_ATTN, PREDICT, ROLLOUT, SPLAT

MUTANTS = [
    # Attention maps
    Mutant(
        "attention rollout: layers multiplied in the wrong order",
        "vision_tx/attention.py",
        "rollout = mixed if rollout is None else mixed @ rollout",
        "rollout = mixed if rollout is None else rollout @ mixed",
        (ROLLOUT,),
    ),
    Mutant(
        "attention rollout: first head only",
        "vision_tx/attention.py",
        "mixed = layer.to(torch.promote_types(layer.dtype, torch.float32)).mean(1)",
        "mixed = layer.to(torch.promote_types(layer.dtype, torch.float32))[:, 0]",
        (ROLLOUT,),
    ),
    Mutant(
        "attention rollout: residual weight ignored",
        "vision_tx/attention.py",
        "mixed = residual * eye + (1 - residual) * mixed",
        "mixed = eye + mixed",
        (ROLLOUT,),
    ),
    Mutant(
        "attention weights: scale 1/d",
        "vision_tx/attention.py",
        "scale = q.shape[-1] ** -0.5 if scale is None else scale",
        "scale = q.shape[-1] ** -1.0 if scale is None else scale",
        (ATTN_WEIGHTS,),
    ),
    Mutant(
        "attention weights: bool mask inverted",
        "vision_tx/attention.py",
        'scores.masked_fill(~attn_mask, float("-inf"))',
        'scores.masked_fill(attn_mask, float("-inf"))',
        (ATTN_WEIGHTS,),
    ),
    Mutant(
        "attention weights: causal mask hides the diagonal",
        "vision_tx/attention.py",
        "torch.ones_like(scores, dtype=torch.bool).triu(1)",
        "torch.ones_like(scores, dtype=torch.bool).triu(0)",
        (ATTN_WEIGHTS,),
    ),
    Mutant(
        "attention maps: last layer taken from the first",
        "vision_tx/attention.py",
        "last = layers[-1][:, :, 0, prefix:]",
        "last = layers[0][:, :, 0, prefix:]",
        (ROLLOUT,),
    ),
    Mutant(
        "detr attention map: first head only",
        "vision_tx/models/detr.py",
        'weights = records["cross"][-1].mean(1)',
        'weights = records["cross"][-1][:, 0]',
        (DETR_ATTN,),
    ),
    Mutant(
        "splat: pixel centres not at half cells",
        "vision_tx/attention.py",
        "x = locations[..., 0] * width - 0.5",
        "x = locations[..., 0] * width",
        (SPLAT, DINO_ATTN),
    ),
    Mutant(
        "splat: y weight from the x corner",
        "vision_tx/attention.py",
        "(1 - (y - cy).abs()) * weights",
        "(1 - (y - cx).abs()) * weights",
        (SPLAT, DINO_ATTN),
    ),
    Mutant(
        "splat: points outside the grid clamped onto its border",
        "vision_tx/attention.py",
        "grid.scatter_add_(1, index, share * inside)",
        "grid.scatter_add_(1, index, share)",
        (SPLAT,),
    ),
    Mutant(
        "dino attention map: heads summed, not averaged",
        "vision_tx/models/query_detector.py",
        "maps.view(batch, queries, *shapes[0]) / heads}",
        "maps.view(batch, queries, *shapes[0])}",
        (DINO_ATTN,),
    ),
    Mutant(
        "dino attention map: first decoder layer",
        "vision_tx/models/query_detector.py",
        "cross = decoder.layers[-1].cross_attn",
        "cross = decoder.layers[0].cross_attn",
        (DINO_ATTN,),
    ),
    # Prediction over tiles
    Mutant(
        "predict: tile boxes not shifted back into the image",
        "vision_tx/lightning/predict.py",
        'shifted = found["boxes"].float() + torch.tensor([x0, y0, x0, y0], dtype=torch.float32)',
        'shifted = found["boxes"].float()',
        (PREDICT,),
    ),
    Mutant(
        "predict: boxes cut by a tile's far side kept",
        "vision_tx/lightning/predict.py",
        "        cut |= ((shifted[:, 2:] >= far) & torch.tensor([x1 < width, y1 < height])).any(1)\n",
        "",
        (PREDICT,),
    ),
    Mutant(
        "predict: NMS across classes",
        "vision_tx/lightning/predict.py",
        "keep = batched_nms(boxes, scores.float(), labels, iou_threshold)",
        "keep = batched_nms(boxes, scores.float(), torch.zeros_like(labels), iou_threshold)",
        (PREDICT,),
    ),
]

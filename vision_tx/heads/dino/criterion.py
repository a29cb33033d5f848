"""The set loss of Deformable DETR and DINO: sigmoid focal classification, L1 + GIoU boxes, on every decoder
layer, on the encoder's selected proposals, and on the denoising queries (whose matching is known)."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.ops import sigmoid_focal_loss

from vision_tx.heads.detr.criterion import box_losses, num_boxes_in_batch
from vision_tx.heads.detr.matcher import HungarianMatcher

Indices = list[tuple[torch.Tensor, torch.Tensor]]


class DINOCriterion(nn.Module):
    """Loss of the outputs of :class:`vision_tx.models.DINO` against normalised targets.

    ``outputs`` holds ``pred_logits [B,Q,C]`` (sigmoid logits, no no-object class), ``pred_boxes [B,Q,4]``,
    ``aux_outputs`` (earlier decoder layers), optionally ``enc_outputs`` (the encoder's selected
    proposals; logits with one channel are class-agnostic objectness, trained with every target as
    class 0), optionally ``pre_outputs`` (D-FINE's first-layer boxes, suffix ``_pre``; ``dn_pre_outputs``
    for its denoising queries, ``_dn_pre``) and ``dn_outputs`` (every layer's denoising predictions with their
    :class:`~vision_tx.heads.dino.denoising.DenoisingQueries`). The decoder layers (and the encoder's
    proposals when they score classes) are matched in one call of ``matcher``. Losses are summed over
    queries and classes and divided by the number of target boxes of the (distributed) batch, times
    the number of denoising groups for the denoising ones. Returns ``loss_ce``, ``loss_bbox``,
    ``loss_giou`` with suffixes ``_{i}`` (decoder layer ``i``), ``_enc`` and ``_dn``/``_dn_{i}``, the
    weighted total ``loss`` and ``class_error`` (%) of the last layer. The default ``matcher`` is
    DINO's: class cost 2 (focal terms), L1 5, GIoU 2.
    """

    class_loss_name = "loss_ce"

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher | None = None,
        weight_ce: float = 1.0,
        weight_bbox: float = 5.0,
        weight_giou: float = 2.0,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = (
            HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=focal_alpha, focal_gamma=focal_gamma)
            if matcher is None
            else matcher
        )
        if self.matcher.focal_alpha is None:
            raise ValueError(
                f"{__name__}: the matcher must score sigmoid logits: give HungarianMatcher a focal_alpha (e.g. 0.25)"
            )
        self.weights = {self.class_loss_name: weight_ce, "loss_bbox": weight_bbox, "loss_giou": weight_giou}
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma

    def forward(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if outputs["pred_logits"].shape[-1] != self.num_classes:
            raise ValueError(
                f"{__name__}: logits have {outputs['pred_logits'].shape[-1]} classes, "
                f"expected num_classes = {self.num_classes}"
            )
        num_boxes = num_boxes_in_batch(targets, outputs["pred_logits"].device)
        layers = [*outputs.get("aux_outputs", []), outputs]
        names = [f"_{i}" for i in range(len(layers) - 1)] + [""]
        encoder = outputs.get("enc_outputs")
        class_agnostic = encoder is not None and encoder["pred_logits"].shape[-1] == 1
        if encoder is not None and not class_agnostic:
            layers, names = [*layers, encoder], [*names, "_enc"]
        if "pre_outputs" in outputs:
            layers, names = [*layers, outputs["pre_outputs"]], [*names, "_pre"]
        logits = torch.cat([layer["pred_logits"] for layer in layers])
        boxes = torch.cat([layer["pred_boxes"] for layer in layers])
        indices = self.matcher(logits, boxes, targets * len(layers))
        losses = self._losses(logits, boxes, targets * len(layers), indices, num_boxes, names)
        losses.update(self.layer_losses(layers, names, targets, indices, num_boxes))
        if class_agnostic:
            agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
            indices_enc = self.matcher(encoder["pred_logits"], encoder["pred_boxes"], agnostic)
            losses.update(
                self._losses(encoder["pred_logits"], encoder["pred_boxes"], agnostic, indices_enc, num_boxes, ["_enc"])
            )
        if "dn_outputs" in outputs:
            denoising = outputs["dn_outputs"]
            queries = denoising["queries"]
            dn_logits, dn_boxes = denoising["pred_logits"], denoising["pred_boxes"]  # [L,B,N,C], [L,B,N,4]
            layers_dn = len(dn_logits)
            dn_names = [f"_dn_{i}" for i in range(layers_dn - 1)] + ["_dn"]
            positives = queries.positive_indices(targets)
            losses.update(
                self._losses(
                    dn_logits.flatten(0, 1),
                    dn_boxes.flatten(0, 1),
                    targets * layers_dn,
                    positives * layers_dn,
                    num_boxes * queries.num_groups,
                    dn_names,
                )
            )
            dn_layers = [
                {key: value[i] for key, value in denoising.items() if key != "queries"} for i in range(layers_dn)
            ]
            losses.update(
                self.layer_losses(dn_layers, dn_names, targets, positives * layers_dn, num_boxes * queries.num_groups)
            )
            if "dn_pre_outputs" in outputs:
                pre = outputs["dn_pre_outputs"]
                losses.update(
                    self._losses(
                        pre["pred_logits"],
                        pre["pred_boxes"],
                        targets,
                        positives,
                        num_boxes * queries.num_groups,
                        ["_dn_pre"],
                    )
                )
        losses["loss"] = sum(value * self.weights["_".join(key.split("_")[:2])] for key, value in losses.items())
        last = len(outputs.get("aux_outputs", [])) * len(targets)  # the last decoder layer's block of indices
        losses["class_error"] = self._class_error(outputs["pred_logits"], targets, indices[last : last + len(targets)])
        return losses

    def _losses(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        targets: list[dict],
        indices: Indices,
        num_boxes: torch.Tensor,
        names: list[str],
    ) -> dict[str, torch.Tensor]:
        """Losses of ``len(names)`` layers stacked in ``logits [len(names)*B,Q,C]`` and ``boxes``."""
        num_layers, device = len(names), logits.device
        image_index = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(indices)]).to(device)
        query_index = torch.cat([q for q, _ in indices]).to(device)
        labels = torch.cat([t["labels"][k] for t, (_, k) in zip(targets, indices)]).to(device)
        target_boxes = torch.cat([t["boxes"][k] for t, (_, k) in zip(targets, indices)]).to(device)
        onehot = torch.zeros_like(logits)
        onehot[image_index, query_index, labels] = 1.0
        # Every layer has the same targets, hence the same number of matched pairs.
        matched = boxes[image_index, query_index].view(num_layers, -1, 4)
        target_boxes = target_boxes.view(num_layers, -1, 4)
        classification = self.classification_loss(
            logits, onehot, (image_index, query_index, labels), matched, target_boxes
        )
        loss_ce = classification.view(num_layers, -1).sum(1) / num_boxes
        loss_bbox, loss_giou = box_losses(matched, target_boxes, num_boxes)
        losses = {}
        for layer, name in enumerate(names):
            losses[f"{self.class_loss_name}{name}"] = loss_ce[layer]
            losses[f"loss_bbox{name}"] = loss_bbox[layer]
            losses[f"loss_giou{name}"] = loss_giou[layer]
        return losses

    def layer_losses(
        self, layers: list[dict], names: list[str], targets: list[dict], indices: Indices, num_boxes: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Further losses of the ``layers`` (the outputs' dicts, named by ``names``) matched by ``indices`` (a
        block of ``len(targets)`` per layer): none here (D-FINE's localisation losses)."""
        return {}

    def classification_loss(
        self,
        logits: torch.Tensor,
        onehot: torch.Tensor,
        positives: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        matched: torch.Tensor,
        target_boxes: torch.Tensor,
    ) -> torch.Tensor:
        """The per-logit classification loss ``[N,Q,C]`` of ``logits`` against ``onehot`` (1 at the
        ``positives``' (image, query, label)), whose boxes ``matched [L,M,4]`` match ``target_boxes``:
        the sigmoid focal loss."""
        return sigmoid_focal_loss(logits, onehot, alpha=self.focal_alpha, gamma=self.focal_gamma, reduction="none")

    @staticmethod
    @torch.no_grad()
    def _class_error(logits: torch.Tensor, targets: list[dict], indices: Indices) -> torch.Tensor:
        predicted = torch.cat([logits[b, q.to(logits.device)].argmax(-1) for b, (q, _) in enumerate(indices)])
        expected = torch.cat([t["labels"][k] for t, (_, k) in zip(targets, indices)]).to(logits.device)
        if len(expected) == 0:
            return logits.new_tensor(0.0)
        return 100 - (predicted == expected).float().mean() * 100

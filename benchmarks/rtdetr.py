"""RT-DETR against transformers' RTDetrForObjectDetection: inference forward and training step.

Both sides read the same backbone maps, computed once before timing (the detector's work only, the
backbone left out), with the same weights (vision_tx without look forward twice, which transformers'
port leaves out: the same computation, checked by comparing the inference boxes of moved weights first, in
float64). A training step is forward, loss (each side draws its own denoising queries), backward and an AdamW
step; in fp32 on a GPU, which also gives each side's peak memory. Rows:

1. RT-DETR-R50's head (hidden 256, 300 queries, 1 AIFI layer, 6 decoder layers, FFN 1024, 3 levels,
   4 points, 100 denoising queries, 80 classes, 7 boxes per image) on Swin-T's stride 8, 16, 32 maps
   of 2 images of 640x640: inference forward and training step.
2. The README's main job, ``rtdetr_convnext_toy`` (hidden 64, 30 queries, 3 decoder layers, the
   paper's CSP layers of 3 RepVGG blocks; the small-data ConvNeXt's maps of 4 images of 128x128,
   3 classes, 3 boxes each): the training step, what its 3-minute CPU training repeats.
"""

from __future__ import annotations

import copy

import torch

from benchmarks.timing import Row, compare
from tests.models.test_rtdetr import MapsBackbone, to_transformers
from tests.parity import perturb_
from vision_tx.backbones import build_backbone
from vision_tx.models import RTDETR

PAPER = dict(num_classes=80, boxes=7, batch=2, size=640, backbone=("swin_t", {}), model={})
TOY = dict(
    num_classes=3,
    boxes=3,
    batch=4,
    size=128,
    backbone=("convnext_toy", {}),
    model=RTDETR.variants["rtdetr_toy"],
)


def _setting(
    setting: dict, device: str
) -> tuple[RTDETR, torch.nn.Module, torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Our model, transformers' with its weights, images, padding mask and targets, on ``device``."""
    import transformers

    generator = torch.Generator().manual_seed(0)
    batch, size = setting["batch"], setting["size"]
    images = torch.randn(batch, 3, size, size, generator=generator)
    targets = []
    for _ in range(batch):
        centres = 0.2 + 0.6 * torch.rand(setting["boxes"], 2, generator=generator)
        sizes = 0.05 + 0.3 * torch.rand(setting["boxes"], 2, generator=generator)
        labels = torch.randint(0, setting["num_classes"], (setting["boxes"],), generator=generator)
        targets.append({"labels": labels.to(device), "boxes": torch.cat([centres, sizes], 1).to(device)})
    images = images.to(device)
    torch.manual_seed(0)
    with torch.no_grad():
        name, kwargs = setting["backbone"]
        maps = list(build_backbone(name, out_indices=(1, 2, 3), **kwargs).to(device).eval()(images).values())
    model = perturb_(
        RTDETR.build(
            MapsBackbone(maps), setting["num_classes"], look_forward_twice=False, num_blocks=3, **setting["model"]
        )
    )
    decoder, encoder = model.decoder.layers[0], model.encoder
    config = transformers.RTDetrConfig(
        backbone_config=transformers.ResNetConfig(
            out_features=["stage2", "stage3", "stage4"],
            embedding_size=8,
            hidden_sizes=[8, *(m.shape[1] for m in maps)],
            depths=[1, 1, 1, 1],
        ),
        num_labels=setting["num_classes"],
        d_model=model.enc_output.in_features,
        encoder_hidden_dim=model.enc_output.in_features,
        encoder_in_channels=[m.shape[1] for m in maps],
        encoder_layers=len(encoder.encoder.layers),
        encoder_ffn_dim=encoder.encoder.layers[0].linear1.out_features,
        encoder_attention_heads=decoder.self_attn.num_heads,
        hidden_expansion=setting["model"].get("expansion", 1.0),
        decoder_in_channels=[model.enc_output.in_features] * 3,
        decoder_ffn_dim=decoder.ffn.linear1.out_features,
        decoder_layers=len(model.decoder.layers),
        decoder_attention_heads=decoder.self_attn.num_heads,
        num_queries=model.num_queries,
    )
    reference = transformers.RTDetrForObjectDetection(config)
    reference.load_state_dict(to_transformers(model.state_dict(), len(model.decoder.layers)), strict=False)
    for parameter in reference.model.backbone.parameters():
        parameter.requires_grad_(False)
    reference.model.backbone.forward = lambda pixel_values, pixel_mask: [(m, None) for m in maps]
    return (
        model.to(device),
        reference.to(device),
        images,
        torch.zeros(batch, size, size, dtype=torch.bool, device=device),
        targets,
    )


def _float64_box_difference(
    ours: RTDETR, reference: torch.nn.Module, images: torch.Tensor, pixel_mask: torch.Tensor
) -> float:
    """The largest difference of the two models' inference boxes, computed on float64 copies: in float32 a rounding
    difference can swap two queries at the top-k boundary of the encoder's proposals and move whole boxes."""
    ours, reference = copy.deepcopy(ours).double().eval(), copy.deepcopy(reference).double().eval()
    ours.backbone.maps = maps = [m.double() for m in ours.backbone.maps]
    reference.model.backbone.forward = lambda pixel_values, pixel_mask: [(m, None) for m in maps]
    with torch.no_grad():
        boxes = ours(images.double(), pixel_mask)["pred_boxes"]
        return float((boxes - reference(images.double()).pred_boxes).abs().max())


def run(device: str, quick: bool) -> list[Row]:
    iters, rows = (1 if quick else 3), []
    for label, setting in (("RT-DETR-R50 head, Swin-T maps", PAPER), ("RT-DETR rtdetr_convnext_toy", TOY)):
        ours, reference, images, pixel_mask, targets = _setting(setting, device)
        labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
        batch, size = setting["batch"], setting["size"]
        difference = _float64_box_difference(ours, reference, images, pixel_mask)
        print(f"{label}: inference boxes, vision_tx vs transformers (float64): largest difference {difference:.1e}")
        if setting is PAPER:

            def ours_forward() -> None:
                with torch.no_grad():
                    ours.eval()(images, pixel_mask)

            def reference_forward() -> None:
                with torch.no_grad():
                    reference.eval()(images)

            rows.append(
                compare(
                    f"{label} forward b{batch} {size}x{size}",
                    ours_forward,
                    reference_forward,
                    "transformers",
                    device=device,
                    unit_items=batch,
                    warmup=1,
                    iters=iters,
                )
            )
        ours_optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4)
        reference_optimizer = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-4)

        def ours_step() -> None:
            ours_optimizer.zero_grad(set_to_none=True)
            ours.train().loss(ours.train()(images, pixel_mask, targets), targets)["loss"].backward()
            ours_optimizer.step()

        def reference_step() -> None:
            reference_optimizer.zero_grad(set_to_none=True)
            reference.train()(images, labels=labels).loss.backward()
            reference_optimizer.step()

        rows.append(
            compare(
                f"{label} train step b{batch} {size}x{size}",
                ours_step,
                reference_step,
                "transformers",
                device=device,
                unit_items=batch,
                warmup=1,
                iters=iters,
            )
        )
    return rows

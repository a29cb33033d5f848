"""Backbones (Swin, NAT, ResNet, ConvNeXt, ViT/DeiT; MLP-Mixer as a classifier) behind one factory.

>>> from vision_tx.backbones import build_backbone
>>> m = build_backbone("swin_t")          # images [N,3,H,W] -> {"res2": ..., "res5": ...}
"""

# Importing each architecture file registers its variants.
from vision_tx.backbones import convnext, mixer, nat, resnet, swin, vit  # noqa: F401
from vision_tx.backbones.registry import build_backbone, build_classifier, list_backbones
from vision_tx.backbones.weights import LoadReport, load_weights, save_weights

__all__ = ["build_backbone", "build_classifier", "list_backbones", "load_weights", "save_weights", "LoadReport"]

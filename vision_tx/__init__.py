"""vision_tx: hierarchical vision transformers (Swin, NAT) for detection and segmentation."""

__version__ = "0.1.0"

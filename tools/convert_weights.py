"""Convert an official checkpoint (Microsoft Swin, timm, SHI-Labs NAT, facebookresearch DETR, IDEA-Research DINO) into a
native vision_tx one, reporting what matched.

    python tools/convert_weights.py --arch swin_t --src swin_tiny_patch4_window7_224.pth --dst swin_t.pth
    python tools/convert_weights.py --arch nat_tiny --form backbone --src nat_tiny.pth --dst nat_tiny_backbone.pth
    python tools/convert_weights.py --arch detr_resnet50 --num-classes 91 --src detr-r50-e632da11.pth --dst detr_r50.pth
    python tools/convert_weights.py --arch dino_resnet50 --src checkpoint0011_4scale.pth --dst dino_r50.pth
    python tools/convert_weights.py --arch detr_panoptic_resnet50 --src detr-r50-panoptic-00ce5173.pth \
        --dst detr_r50_panoptic.pth
"""

import argparse

from vision_tx.models.convert import convert_checkpoint

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--arch",
        required=True,
        help="a backbone name (see vision_tx.backbones.list_backbones()) detr_<backbone>, detr_panoptic_<backbone> "
        "or dino_<backbone>",
    )
    parser.add_argument("--form", choices=("classifier", "backbone"), default="classifier")
    parser.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="classes of the head (default: 1000; 91 for DETR and DINO, 250 for DETR panoptic); a whole model of "
        "another count than the checkpoint keeps its own class tensors, named in the report",
    )
    parser.add_argument("--src", required=True)
    parser.add_argument("--dst", required=True)
    parser.add_argument("--strict", action="store_true", help="fail on any missing or unused key")
    args = parser.parse_args()
    print(
        convert_checkpoint(
            args.arch, args.src, args.dst, form=args.form, num_classes=args.num_classes, strict=args.strict
        )
    )

"""Draw a trained model's attention on an image: for a ViT/DeiT classifier the attention rollout and the
last layer's class-token attention per head; for DETR and DINO each detected object's last decoder layer
cross-attention (DINO's deformable one drawn at its sampling points).

    python tools/attention.py --config deit_small_imagenet --ckpt runs/.../last.ckpt --image cat.jpg \
        --out cat_attention.png
"""

import argparse

from vision_tx.lightning.inference import load_trained, read_rgb_image
from vision_tx.visualize import save_grid

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint of the model")
    parser.add_argument("--image", required=True, help="input image (any format PIL reads)")
    parser.add_argument("--out", required=True, help="output PNG")
    parser.add_argument("--score-threshold", type=float, default=0.7, help="detectors: objects shown from this score")
    args, config_args = parser.parse_known_args()
    module, datamodule = load_trained(config_args, args.ckpt)
    pictures = module.attention_pictures(read_rgb_image(args.image), datamodule, args.score_threshold)
    print(f"wrote {save_grid(pictures, args.out)}")

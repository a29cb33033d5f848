"""Draw a trained model's predictions on an image.

    python tools/infer.py --config detr_swin_toy --ckpt runs/.../last.ckpt --image cat.jpg --out cat_pred.png
"""

import argparse

from vision_tx.lightning.inference import infer_image

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint of the model")
    parser.add_argument("--image", required=True, help="input image (any format PIL reads)")
    parser.add_argument("--out", required=True, help="output PNG")
    args, config_args = parser.parse_known_args()
    print(f"wrote {infer_image(config_args, args.ckpt, args.image, args.out)}")

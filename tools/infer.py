"""Draw a trained model's predictions on an image (installed: ``vision-tx infer``).

python tools/infer.py --config detr_swin_toy --ckpt runs/.../last.ckpt --image cat.jpg --out cat_pred.png
"""

from vision_tx.lightning.inference import infer_main

if __name__ == "__main__":
    infer_main()

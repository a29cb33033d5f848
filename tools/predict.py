"""A trained detector over an image, a folder, a glob pattern or a video, in batches, tiled for large images
(installed: ``vision-tx predict``); writes a COCO results file, an images index, per-image JSON and drawn pictures.

    python tools/predict.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --source photos/ --out predicted/
    python tools/predict.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --source big.png \
        --tile 512 --overlap 0.25
"""

from vision_tx.lightning.predict import predict_main

if __name__ == "__main__":
    predict_main()

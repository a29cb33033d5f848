"""Evaluate: a COCO results file, panoptic results, a trained checkpoint or an exported ONNX detector (see ``--help``;
installed: ``vision-tx eval``).

    python tools/eval.py --gt instances_val2017.json --results results.json --iou-type bbox
    python tools/eval.py --config detr_swin_t --ckpt runs/last.ckpt --data.root /data/coco
    python tools/eval.py --config rtdetr_convnext_toy --onnx rtdetr.onnx --data.root /data/coco  # in onnxruntime
"""

from vision_tx.lightning.cli import eval_main

if __name__ == "__main__":
    eval_main()

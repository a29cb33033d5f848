"""Evaluate: a COCO results file, panoptic results, or a trained checkpoint (see ``--help``; installed: ``vision-tx eval``).

    python tools/eval.py --gt instances_val2017.json --results results.json --iou-type bbox
    python tools/eval.py --config detr_swin_t --ckpt runs/last.ckpt --data.root /data/coco
"""

from vision_tx.lightning.cli import eval_main

if __name__ == "__main__":
    eval_main()

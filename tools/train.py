"""Train a vision_tx model from a config: ``python tools/train.py --config detr_swin_t [--section.key value ...]``
(installed: ``vision-tx train ...``).

Without ``--data.root`` the built-in toy dataset is used (and the log says so). Resume a run with
``--ckpt_path last`` (or a checkpoint path). See ``--help`` for every option.
"""

from vision_tx.lightning.cli import train_main

if __name__ == "__main__":
    train_main()

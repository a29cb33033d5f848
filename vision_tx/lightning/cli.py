"""The command line: LightningCLI with config names from ``configs/`` and dotted overrides.

    python tools/train.py --config detr_swin_t --data.root /data/coco --trainer.devices 4

``--config`` takes a name from ``configs/`` (without ``.yaml``) or a path to a YAML file; every
value in it can be overridden with ``--section.key value`` (``--model.lr 2e-4``).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Sequence

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

CONFIG_DIRS = (Path.cwd() / "configs", Path(__file__).resolve().parents[2] / "configs")


def available_configs() -> list[str]:
    """Names of the YAML files in ``configs/``."""
    return sorted({p.stem for d in CONFIG_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def resolve_config(name_or_path: str) -> Path:
    """``detr_swin_t`` -> ``configs/detr_swin_t.yaml``; an existing file path is returned as is."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for directory in CONFIG_DIRS:
        candidate = directory / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    raise SystemExit(
        f"error: no config named {name_or_path!r} (not a file, not in configs/). "
        f"Available: {', '.join(available_configs())}"
    )


def resolve_config_args(argv: Sequence[str]) -> list[str]:
    """Replaces each ``--config NAME`` (or ``--config=NAME``) with the YAML path it names."""
    args = list(argv)
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config" and i + 1 < len(args):
            out += ["--config", str(resolve_config(args[i + 1]))]
            i += 2
            continue
        if arg.startswith("--config="):
            arg = f"--config={resolve_config(arg.split('=', 1)[1])}"
        out.append(arg)
        i += 1
    return out


class VisionTxCLI(LightningCLI):
    """LightningCLI for any vision_tx task: the config names the LightningModule and DataModule classes."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"trainer.log_every_n_steps": 10})


def run_cli(subcommand: str, argv: Sequence[str] | None = None) -> VisionTxCLI:
    """Runs ``subcommand`` (``fit``, ``validate``, ...) with the given (or the process's) arguments."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--config" not in " ".join(argv) and not any(a in ("-h", "--help") for a in argv):
        raise SystemExit(f"error: --config is required; available: {', '.join(available_configs())}")
    show_library_log()
    # sys.argv stays as it is (DDP relaunches this script with it); the resolved arguments go in
    # ``args``, which LightningCLI would otherwise warn about when the process has arguments too.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    return VisionTxCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=[subcommand, *resolve_config_args(argv)],
    )


def show_library_log() -> None:
    """Sends vision_tx's INFO messages (which dataset is used, what was dropped) to the console."""
    logger = logging.getLogger("vision_tx")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[vision_tx] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def eval_main(argv: Sequence[str] | None = None) -> None:
    """``tools/eval.py``: score saved result files, or validate a checkpoint with a config.

    - ``--gt ANN.json --results RES.json [--iou-type bbox|segm]``: COCO evaluation of a results file;
    - ``--gt-panoptic GT.json --gt-folder DIR --pred-panoptic PRED.json --pred-folder DIR``: PQ;
    - ``--config NAME --ckpt PATH [--section.key value ...]``: validation of a trained model, which
      prints the metrics and writes ``metrics.json``.
    """
    import argparse

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="tools/eval.py", description=eval_main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gt", help="COCO annotation json")
    parser.add_argument("--results", help="COCO results json")
    parser.add_argument("--iou-type", default="bbox", choices=("bbox", "segm"))
    parser.add_argument("--gt-panoptic", help="COCO panoptic ground-truth json")
    parser.add_argument("--gt-folder", help="folder of ground-truth panoptic PNGs")
    parser.add_argument("--pred-panoptic", help="predicted panoptic json")
    parser.add_argument("--pred-folder", help="folder of predicted panoptic PNGs")
    parser.add_argument("--ckpt", help="checkpoint to validate (with --config)")
    known, rest = parser.parse_known_args(argv)

    if known.gt or known.results:
        if not (known.gt and known.results):
            parser.error("--gt and --results go together")
        from vision_tx.metrics.coco import evaluate_results_file

        stats = evaluate_results_file(known.gt, known.results, iou_type=known.iou_type)
        print(f"{known.iou_type} stats (full precision):")
        for name, value in stats.items():
            print(f"  {name:<5} {value!r}")
    elif known.gt_panoptic or known.pred_panoptic:
        if not all((known.gt_panoptic, known.gt_folder, known.pred_panoptic, known.pred_folder)):
            parser.error("--gt-panoptic, --gt-folder, --pred-panoptic and --pred-folder go together")
        from vision_tx.metrics.panoptic import evaluate_panoptic_files

        evaluate_panoptic_files(known.gt_panoptic, known.gt_folder, known.pred_panoptic, known.pred_folder)
    else:
        if not known.ckpt:
            parser.error("give --gt/--results, the panoptic files, or --config with --ckpt")
        run_cli("validate", [*rest, "--ckpt_path", known.ckpt])

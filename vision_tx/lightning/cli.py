"""The command line: LightningCLI with config names from ``vision_tx/configs/`` and dotted overrides.

    python tools/train.py --config detr_swin_t --data.root /data/coco --trainer.devices 4
    vision-tx train --config detr_swin_t --data.root /data/coco --trainer.devices 4   # the same, installed

``--config`` takes a name from ``configs/`` in the working directory or from the package's
``vision_tx/configs/`` (without ``.yaml``), or a path to a YAML file; every value in it can be
overridden with ``--section.key value`` (``--model.lr 2e-4``). A config's ``__base__`` files are merged
under it as it is read (:mod:`vision_tx.config_loader`); ``--print_config`` shows the result.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import logging
import re
import shutil
import sys
import warnings
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import NoReturn

import torch.distributed
import yaml
from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from vision_tx.backbones import list_backbones
from vision_tx.checkpoint import CheckpointError, read_training_checkpoint
from vision_tx.config_loader import BASE_KEY, CONFIG_DIRS, ConfigError, resolve_bases
from vision_tx.data.invalid import InvalidDataError
from vision_tx.io import merge_metrics_json
from vision_tx.lightning.augmentation import LongRunAugmentation
from vision_tx.lightning.budget import TrainingBudget
from vision_tx.lightning.callbacks import NonFiniteLossGuard, RandomStateCheckpoint, TrainingMonitor, ValidationReport
from vision_tx.lightning.checkpoint_io import AtomicCheckpointIO


def available_configs() -> list[str]:
    """Names of the YAML files in the folders of :data:`CONFIG_DIRS`."""
    return sorted({p.stem for d in CONFIG_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def resolve_config(name_or_path: str) -> Path:
    """The YAML file ``name_or_path`` names: ``detr_swin_t`` -> ``vision_tx/configs/detr_swin_t.yaml``; an existing
    file path is returned as is."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for directory in CONFIG_DIRS:
        candidate = directory / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    raise SystemExit(
        f"error: no config named {name_or_path!r} (not a file, not in {' or '.join(map(str, CONFIG_DIRS))}). "
        f"Available: {', '.join(available_configs())}"
    )


def resolve_config_args(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` with each ``--config NAME`` (or ``--config=NAME``) replaced by the YAML path it names."""
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


def config_name(args: Sequence[str]) -> str:
    """The name of the first ``--config`` file in ``args`` (as :func:`resolve_config_args` gives them), or ``run``."""
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return Path(args[i + 1]).stem
        if arg.startswith("--config="):
            return Path(arg.split("=", 1)[1]).stem
    return "run"


def class_options(class_path: str) -> list[str]:
    """The constructor arguments of the class at ``class_path`` (``package.module.Class``), with those
    of the base classes its ``**kwargs`` are passed on to."""
    module, _, name = class_path.rpartition(".")
    options: list[str] = []
    for cls in getattr(importlib.import_module(module), name).__mro__:
        if "__init__" not in vars(cls):
            continue
        parameters = inspect.signature(cls.__init__).parameters.values()
        options += [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return options


def explain_unknown_options(message: str) -> str:
    """Puts, before jsonargparse's ``Option 'x' is not accepted`` errors in ``message``, a line per unknown option
    with the closest valid name and all the valid ones."""
    lines = []
    for class_path, option in re.findall(r"class_path '([\w.]+)':\s+Option '(\w+)' is not accepted", message):
        valid = class_options(class_path)
        close = difflib.get_close_matches(option, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        lines.append(
            f"{class_path.rpartition('.')[2]} has no option {option!r}{hint}. Valid options: {', '.join(valid)}"
        )
    return "\n".join([*lines, message])


class VisionTxArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, which reads a config file's ``__base__`` files under it, and whose errors about unknown
    options also list the valid ones."""

    _config_file: Path | None = None  # the file parse_path hands to parse_string

    def parse_path(self, path: str | PathLike, *args, **kwargs) -> Namespace:
        self._config_file = Path(str(path)).resolve()  # before jsonargparse enters the file's folder
        try:
            return super().parse_path(path, *args, **kwargs)
        finally:
            self._config_file = None

    def parse_string(self, content: str, *args, **kwargs) -> Namespace:
        """``content`` (a config file's text, or a ``--config`` string) with its ``__base__`` files merged under it."""
        file, self._config_file = self._config_file, None
        try:
            loaded = yaml.safe_load(content) if BASE_KEY in content else None
        except yaml.YAMLError:
            loaded = None  # jsonargparse's own error follows
        if isinstance(loaded, dict) and BASE_KEY in loaded:
            content = yaml.safe_dump(resolve_bases(loaded, file), sort_keys=False)
        return super().parse_string(content, *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # Nested parsers raise (their message is folded into the outer one): explain once, in the shown one.
        super().error(explain_unknown_options(message) if self.exit_on_error else message, ex)


class VisionTxCLI(LightningCLI):
    """LightningCLI for any vision_tx task: the config names the LightningModule and DataModule classes; its parser
    (unless ``parser_class`` says otherwise) is :class:`VisionTxArgumentParser`, which reads a config's bases."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("parser_class", VisionTxArgumentParser)
        # The tools leave sys.argv as it is (DDP relaunches the script with it) and pass the resolved
        # arguments in ``args``, which LightningCLI would otherwise warn about when the process has arguments.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            # Under DDP Lightning asks for sync_dist on epoch-level values; the validation metrics are computed
            # once over every process's predictions (gathered or summed) and are already the same on every rank.
            warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('val/")
            super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(
            {
                "trainer.log_every_n_steps": 10,
                "trainer.plugins": [{"class_path": "vision_tx.lightning.checkpoint_io.AtomicCheckpointIO"}],
            }
        )
        # Always on, configured with --loss_guard.policy skip|stop and --loss_guard.max_consecutive_skips.
        parser.add_lightning_class_args(NonFiniteLossGuard, "loss_guard")
        parser.add_lightning_class_args(RandomStateCheckpoint, "random_state")
        # What the logger (TensorBoard's unless --trainer.logger says otherwise) shows beside the
        # module's own scalars: learning rates, gradient norm, speed, memory; pictures and tables.
        parser.add_lightning_class_args(TrainingMonitor, "monitor")
        parser.add_lightning_class_args(ValidationReport, "report")
        # Off unless --budget.minutes M: the config's step plan stretched to M minutes of training.
        parser.add_lightning_class_args(TrainingBudget, "budget")
        # Applies the datamodule's augmentation_schedule (none: nothing to do).
        parser.add_lightning_class_args(LongRunAugmentation, "long_run")

    def before_instantiate_classes(self) -> None:
        """``--budget.minutes``: the config's ``trainer.max_steps`` becomes the budget's ``planned_steps`` and the
        trainer gets no step or epoch limit, so that the budget alone ends the run (the saved config says so)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        budget, trainer = config.get("budget"), config.get("trainer")
        if budget is None or trainer is None or not budget.get("minutes"):
            return
        if budget.get("planned_steps") is None and (trainer.get("max_steps") or -1) > 0:
            budget["planned_steps"] = trainer["max_steps"]
        trainer["max_steps"] = -1
        if trainer.get("max_epochs") is None:
            trainer["max_epochs"] = -1

    def before_subcommand(self) -> None:
        """Checks the backbone name before any data is read, and lets the checkpoint reader check a
        checkpoint to resume or validate against this model."""
        backbone = getattr(self.model, "hparams", {}).get("backbone")
        if isinstance(backbone, str) and backbone not in list_backbones():
            close = difflib.get_close_matches(backbone, list_backbones(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SystemExit(f"error: unknown backbone {backbone!r}{hint}; known names: {', '.join(list_backbones())}")
        checkpoint_io = self.trainer.strategy.checkpoint_io
        if isinstance(checkpoint_io, AtomicCheckpointIO):
            checkpoint_io.model = self.model

    before_fit = before_validate = before_test = before_predict = before_subcommand

    def parse_arguments(self, parser: LightningArgumentParser, args: Sequence[str] | dict | Namespace | None) -> None:
        self.command_line_model_options = model_option_names(command_line(args))
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters first: check the file before, so that a
        # corrupt, truncated, untrusted or foreign file is an error naming it (mapped, not read: the
        # file is read whole twice after this, by LightningCLI and by the restore).
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path == "last":
            ckpt_path = self.config[subcommand]["ckpt_path"] = latest_last_checkpoint(
                self.config[subcommand]["trainer"]["default_root_dir"]
            )
        if ckpt_path and Path(ckpt_path).is_file():
            read_training_checkpoint(ckpt_path, mmap=True)
        given = self.config[subcommand].get("model.init_args") if subcommand else None
        given = given.clone() if given is not None else None
        super()._parse_ckpt_path()
        if given is not None:
            self._put_command_line_over_checkpoint(given, self.config[subcommand]["model.init_args"])

    def _put_command_line_over_checkpoint(self, given: Namespace, from_checkpoint: Namespace) -> None:
        """LightningCLI puts the checkpoint's hyperparameters over the config and the command line (Lightning
        issue #20801): the model is the one trained, whatever the config says. Each option the command line
        gives (``--model.lr``) is put back over them, a dict (``--model.detector_kwargs '{share_scores:
        false}'``) merged into the checkpoint's."""
        kept = []
        for name in self.command_line_model_options:
            if name not in from_checkpoint or name not in given:
                continue
            value = given[name]  # a dict given on the command line replaces the config's whole
            if isinstance(from_checkpoint[name], dict) and isinstance(value, dict):
                value = {**from_checkpoint[name], **value}
            if value != from_checkpoint[name]:
                kept.append(f"{name}: {value!r} (checkpoint: {from_checkpoint[name]!r})")
                from_checkpoint[name] = value
        if kept:
            logging.getLogger("vision_tx").info(
                "the checkpoint's model options, but from the command line %s", "; ".join(kept)
            )


def command_line(args: Sequence[str] | dict | Namespace | None) -> list[str]:
    """The command-line options among LightningCLI's ``args``: ``sys.argv[1:]`` for None (what LightningCLI then
    parses), the list itself, none in a dict or Namespace of options."""
    if args is None:
        return sys.argv[1:]
    return list(args) if isinstance(args, (list, tuple)) else []


def model_option_names(args: Sequence[str]) -> list[str]:
    """The NAMEs of the ``--model.NAME VALUE`` (or ``--model.NAME=VALUE``, ``--model.init_args.NAME``)
    options in ``args``."""
    names = [arg.removeprefix("--model.").partition("=")[0] for arg in args if arg.startswith("--model.")]
    return list(dict.fromkeys(name.removeprefix("init_args.") for name in names))


def latest_last_checkpoint(root_dir: str | Path | None) -> str:
    """The newest ``last.ckpt`` under ``root_dir`` (any logger version), or ``"last"`` when there is none.

    Every run opens a new logger version folder, so Lightning's own ``ckpt_path="last"`` would look
    in the new, empty one; a resumed run writes its checkpoints (and logs) in the new folder."""
    candidates = list(Path(root_dir).glob("**/last.ckpt")) if root_dir else []
    return str(max(candidates, key=lambda path: path.stat().st_mtime)) if candidates else "last"


def run_cli(subcommand: str, argv: Sequence[str] | None = None) -> VisionTxCLI:
    """Runs ``subcommand`` (``fit``, ``validate``, ...) with the arguments ``argv`` (default: the process's)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--config" not in " ".join(argv) and not any(a in ("-h", "--help") for a in argv):
        raise SystemExit(f"error: --config is required; available: {', '.join(available_configs())}")
    show_library_log()
    args = resolve_config_args(argv)
    try:
        return VisionTxCLI(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            parser_class=VisionTxArgumentParser,
            # Logs, checkpoints and metrics of a config go to runs/<config name>/ unless it says otherwise.
            trainer_defaults={"default_root_dir": str(Path("runs") / config_name(args))},
            args=[subcommand, *args],
        )
    except Exception as err:
        user_error = input_error(err)
        if user_error is None:
            raise
        raise SystemExit(f"error: {worker_message(user_error)}") from err
    finally:
        end_process_group()


def configured(args: Sequence[str]) -> VisionTxCLI:
    """The model, datamodule and trainer that the resolved ``args`` (``--config NAME [--section.key value ...]``,
    see :func:`resolve_config_args`) build, without running anything or saving the config."""
    return VisionTxCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        save_config_callback=None,
        args=list(args),
    )


def end_process_group() -> None:
    """Destroys the process group Lightning's DDP left behind: one still alive when the interpreter
    shuts down can abort the process (``terminate called without an active exception``) from gloo's
    worker threads after the run itself succeeded."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def input_error(err: BaseException | None) -> BaseException | None:
    """The bad-data, bad-checkpoint or bad-config-base error (whose message names the file and the problem) behind
    ``err``, if any: jsonargparse wraps the errors raised while it builds the classes in its own."""
    while err is not None:
        if isinstance(err, (InvalidDataError, CheckpointError, ConfigError)):
            return err
        err = err.__cause__ or err.__context__
    return None


def worker_message(err: BaseException) -> str:
    """``err``'s own message: an error raised in a DataLoader worker comes back wrapped in torch's
    ``Caught ... in DataLoader worker process N.`` and the worker's traceback, whose last part is
    ``module.Class: message``."""
    message = str(err)
    if not message.startswith("Caught ") or "DataLoader worker process" not in message.split("\n", 1)[0]:
        return message
    prefix = f"\n{type(err).__module__}.{type(err).__qualname__}: "
    return message.rpartition(prefix)[2].strip() if prefix in message else message


def show_library_log() -> None:
    """Sends vision_tx's INFO messages (which dataset is used, what was dropped) to the console."""
    logger = logging.getLogger("vision_tx")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[vision_tx] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def eval_main(argv: Sequence[str] | None = None) -> None:
    """``tools/eval.py``: score saved result files, or validate a checkpoint with a config, as ``argv`` (default: the
    process's arguments) says.

    - ``--gt ANN.json --results RES.json [--iou-type bbox|segm]``: COCO evaluation of a results file;
    - ``--gt-panoptic GT.json --gt-folder DIR --pred-panoptic PRED.json --pred-folder DIR``: PQ;
    - ``--config NAME --ckpt PATH [--section.key value ...]``: validation of a trained model;
    - ``--config NAME --onnx FILE [--section.key value ...]``: the same of an exported detector, in onnxruntime.

    Every mode prints the metrics and writes them, per-category tables included, to
    ``--out DIR/metrics.json`` (default: the working directory) as ``{"bbox"|"segm"|"panoptic"|...: {...}}``.
    """
    import argparse

    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg.partition("=")[0] == "--onnx" for arg in argv):
        return run_entry_point(ONNX_EVAL, argv)
    parser = argparse.ArgumentParser(
        prog="tools/eval.py", description=eval_main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gt", help="COCO annotation json")
    parser.add_argument("--results", help="COCO results json")
    parser.add_argument("--iou-type", default="bbox", choices=("bbox", "segm"))
    parser.add_argument("--gt-panoptic", help="COCO panoptic ground-truth json")
    parser.add_argument("--gt-folder", help="folder of ground-truth panoptic PNGs")
    parser.add_argument("--pred-panoptic", help="predicted panoptic json")
    parser.add_argument("--pred-folder", help="folder of predicted panoptic PNGs")
    parser.add_argument("--ckpt", help="checkpoint to validate (with --config)")
    parser.add_argument(
        "--onnx",
        help="an exported detector (tools/export.py) to validate in onnxruntime (with --config; "
        "--onnx FILE --help: its options)",
    )
    parser.add_argument(
        "--out", default=".", help="folder of the metrics.json written (default: the working directory)"
    )
    known, rest = parser.parse_known_args(argv)
    metrics_json = Path(known.out) / "metrics.json"

    if known.gt or known.results:
        if not (known.gt and known.results):
            parser.error("--gt and --results go together")
        from vision_tx.metrics.coco import evaluate_results_file

        stats = evaluate_results_file(known.gt, known.results, iou_type=known.iou_type, metrics_json=metrics_json)
        print(f"{known.iou_type} stats (full precision):")
        for name, value in stats.items():
            if name != "per_category":
                print(f"  {name:<5} {value!r}")
    elif known.gt_panoptic or known.pred_panoptic:
        if not all((known.gt_panoptic, known.gt_folder, known.pred_panoptic, known.pred_folder)):
            parser.error("--gt-panoptic, --gt-folder, --pred-panoptic and --pred-folder go together")
        from vision_tx.metrics.panoptic import evaluate_panoptic_files

        evaluate_panoptic_files(
            known.gt_panoptic, known.gt_folder, known.pred_panoptic, known.pred_folder, metrics_json
        )
    else:
        if not known.ckpt:
            parser.error("give --gt/--results, the panoptic files, or --config with --ckpt")
        from vision_tx.metrics.detection_report import PICTURES

        cli = run_cli("validate", [*rest, "--ckpt_path", known.ckpt])
        # The module wrote its sections into the run's log folder: the same ones go to --out.
        written = Path(cli.trainer.log_dir or cli.trainer.default_root_dir) / "metrics.json"
        if cli.trainer.is_global_zero and written.is_file() and written.resolve() != metrics_json.resolve():
            for section, values in json.loads(written.read_text()).items():
                merge_metrics_json(section, values, metrics_json)
            for picture in PICTURES:  # a detector's report, beside its numbers
                if (written.parent / f"{picture}.png").is_file():
                    shutil.copyfile(written.parent / f"{picture}.png", metrics_json.parent / f"{picture}.png")
        print(f"metrics: {metrics_json}")


# The subcommands of ``vision-tx`` (the console entry point), each ``module:function(argv)``; the tools of
# ``tools/`` run the same functions.
SUBCOMMANDS = {
    "train": "vision_tx.lightning.cli:train_main",
    "eval": "vision_tx.lightning.cli:eval_main",
    "infer": "vision_tx.lightning.inference:infer_main",
    "predict": "vision_tx.lightning.predict:predict_main",
    "export": "vision_tx.export:main",
}


ONNX_EVAL = "vision_tx.lightning.onnx_eval:main"  # eval_main's --onnx mode


def run_entry_point(entry_point: str, argv: Sequence[str]) -> None:
    """Runs ``entry_point`` (``module:function``) on ``argv``, as ``function(argv)``, imported only now (those modules
    build on this one)."""
    module, _, function = entry_point.partition(":")
    getattr(importlib.import_module(module), function)(list(argv))


def train_main(argv: Sequence[str] | None = None) -> None:
    """``tools/train.py``, ``vision-tx train``: fits the model of ``--config NAME [--section.key value ...]`` in
    ``argv`` (default: the process's arguments)."""
    run_cli("fit", argv)


def main(argv: Sequence[str] | None = None) -> None:
    """``vision-tx SUBCOMMAND [options]``, read from ``argv`` (default: the process's arguments): ``train``, ``eval``,
    ``infer``, ``predict`` or ``export``, as ``tools/<subcommand>.py``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        raise SystemExit(f"usage: vision-tx {{{','.join(SUBCOMMANDS)}}} [options]  (--help after one for its options)")
    run_entry_point(SUBCOMMANDS[argv[0]], argv[1:])

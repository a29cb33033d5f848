"""What ``compare_detection.py`` and ``compare_classification.py`` share: their common options, the
machine's description, the clock of a vision_tx training run, and the side-by-side table.

Training time is counted without validation on both sides of a comparison (each side validates
once, after its budget), as wall-clock and as CPU seconds of the process (all its threads).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import torch


def comparison_parser(doc: str, root_help: str, config: str, out: str) -> argparse.ArgumentParser:
    """The options both comparisons take: the data ``root``, the vision_tx ``--config``, ``--out``, the
    time budget, threads, loader workers and seed; each script adds its peer's own."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path, help=root_help)
    p.add_argument("--config", default=config, help="the vision_tx config")
    p.add_argument("--out", type=Path, default=Path(out), help="where both runs and the results go")
    p.add_argument("--budget-seconds", type=float, help="training time of both sides (default: vision_tx's own run's)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of both sides")
    p.add_argument("--workers", type=int, default=0, help="data loader workers of both sides")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_with_vision_tx_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The script's options, and those after ``--``, which go to vision_tx's training command."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def cpu_description() -> dict[str, Any]:
    """The CPU model (``lscpu``'s model name) and its vector extensions (AVX2, AVX-512 families)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"^(?:Model name|model name)\s*:\s*(.+)$", text, re.MULTILINE)
    flags = re.search(r"^(?:Flags|flags)\s*:\s*(.+)$", text, re.MULTILINE)
    vector = sorted(f for f in (flags.group(1).split() if flags else []) if f == "avx2" or f.startswith(("avx512", "amx")))
    return {"model": model.group(1).strip() if model else platform.processor(), "vector_extensions": vector,
            "logical_cpus": torch.multiprocessing.cpu_count()}


def machine_line(cpu: dict[str, Any], threads: int, versions: dict[str, str]) -> str:
    """``CPU model (AVX2, AVX-512 F/BF16/FP16/VNNI, AMX), N threads, torch X, ...`` in one line."""
    shown = [f for f in cpu["vector_extensions"] if f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni")
             or f.startswith("amx")]
    packages = ", ".join(f"{name} {version}" for name, version in versions.items())
    return f"{cpu['model']} ({' '.join(shown) or 'no AVX2'}), {threads} threads, {packages}"


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of ``packages`` (``"absent"`` where one is not installed)."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


class TrainingClock(pl.Callback):
    """Counts a Lightning run's training: wall-clock and process CPU seconds from the start of
    training to its end without the validations, images seen, optimizer steps, and the torch
    threads in use. With ``budget_seconds`` it stops the run once that much training time is spent.
    """

    def __init__(self, budget_seconds: float | None = None) -> None:
        self.budget_seconds = budget_seconds
        self.wall = self.cpu = 0.0
        self.images = 0
        self.threads: set[int] = set()
        self.steps = self.validated_step = None
        self._started: tuple[float, float] | None = None
        self._training = False

    def _pause(self) -> None:
        if self._started is not None:
            wall, cpu = self._started
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self._started = None

    def _resume(self) -> None:
        self._started = (time.perf_counter(), time.process_time())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training = True
        self._resume()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._training and not trainer.sanity_checking:
            self.validated_step = trainer.global_step
            self._resume()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.images += len(batch["images"]) if isinstance(batch, dict) else len(batch[0])
        self.threads.add(torch.get_num_threads())
        if self.budget_seconds is not None and self.elapsed() >= self.budget_seconds:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()
        self._training = False
        self.steps = trainer.global_step

    def elapsed(self) -> float:
        """Training wall-clock so far, seconds."""
        return self.wall + (time.perf_counter() - self._started[0] if self._started else 0.0)

    def summary(self) -> dict[str, Any]:
        return {"train_seconds": self.wall, "cpu_seconds": self.cpu, "images_seen": self.images,
                "images_per_second": self.images / max(self.wall, 1e-9), "steps": self.steps,
                "validated_step": self.validated_step,
                "torch_threads": sorted(self.threads)}


def train_vision_tx(config: str, data_root: str, out: Path, seed: int, workers: int,
                    budget_seconds: float | None, extra: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """Trains ``config`` on ``data_root`` through vision_tx's CLI (``tools/train.py``'s ``fit``), with
    a :class:`TrainingClock` appended to its callbacks; returns the CLI (trainer, model, datamodule)
    and the clock's summary."""
    from vision_tx.lightning.cli import run_cli

    clock = {"class_path": f"{__name__}.TrainingClock", "init_args": {"budget_seconds": budget_seconds}}
    args = ["--config", config, "--data.root", str(data_root), "--seed_everything", str(seed),
            "--data.num_workers", str(workers), "--trainer.default_root_dir", str(out),
            f"--trainer.callbacks+={json.dumps(clock)}", *extra]
    print(f"vision_tx: python tools/train.py {shlex.join(args)}", flush=True)
    cli = run_cli("fit", args)
    found = [c for c in cli.trainer.callbacks if type(c).__name__ == "TrainingClock"]
    return cli, found[0].summary()


def side_by_side(title: str, names: Sequence[str], columns: dict[str, dict[str, Any]]) -> str:
    """A text table: one row per name in ``names``, one column per entry of ``columns``."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    width = max(len(n) for n in names) + 2
    head = "".join(f"{c:>20}" for c in columns)
    lines = [title, f"{'':<{width}}{head}"]
    lines += [f"{n:<{width}}" + "".join(f"{cell(col.get(n, '')):>20}" for col in columns.values()) for n in names]
    return "\n".join(lines)


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"results: {path}")

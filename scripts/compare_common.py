"""What ``compare_detection.py`` and ``compare_classification.py`` share: their common options, the
machine's description, a vision_tx training run with its clock, and the side-by-side table.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def comparison_parser(
    doc: str, root_help: str, config: str, out: str, root_optional: bool = False
) -> argparse.ArgumentParser:
    """The options both comparisons take: the data ``root`` (optional where the script offers suites of sets), the
    vision_tx ``--config``, ``--out``, the time budget, threads, loader workers and seed; each script adds its peer's
    own."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path, help=root_help, **({"nargs": "?"} if root_optional else {}))
    p.add_argument("--config", default=config, help="the vision_tx config")
    p.add_argument("--out", type=Path, default=Path(out), help="where both runs and the results go")
    p.add_argument("--budget-seconds", type=float, help="training time of both sides (default: vision_tx's own run's)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of both sides")
    p.add_argument("--workers", type=int, default=0, help="data loader workers of both sides")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_with_vision_tx_options(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str]]:
    """The script's options, and those after ``--``, which go to vision_tx's training command."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def cpu_description() -> dict[str, Any]:
    """The CPU model (``lscpu``'s model name) and its vector extensions (AVX2, AVX-512 families)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"^(?:Model name|model name)\s*:\s*(.+)$", text, re.MULTILINE)
    flags = re.search(r"^(?:Flags|flags)\s*:\s*(.+)$", text, re.MULTILINE)
    vector = sorted(
        f for f in (flags.group(1).split() if flags else []) if f == "avx2" or f.startswith(("avx512", "amx"))
    )
    return {
        "model": model.group(1).strip() if model else platform.processor(),
        "vector_extensions": vector,
        "logical_cpus": torch.multiprocessing.cpu_count(),
    }


def machine_line(cpu: dict[str, Any], threads: int, versions: dict[str, str]) -> str:
    """``CPU model (AVX2, AVX-512 F/BF16/FP16/VNNI, AMX), N threads, torch X, ...`` in one line."""
    shown = [
        f
        for f in cpu["vector_extensions"]
        if f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni") or f.startswith("amx")
    ]
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


def training_args(
    config: str,
    data_root: str | Path,
    out: Path,
    seed: int,
    workers: int,
    budget_seconds: float | None,
    extra: Sequence[str],
) -> list[str]:
    """``tools/train.py``'s arguments for a comparison run: the config on ``data_root``, logs in ``out``,
    with ``--budget.minutes`` when ``budget_seconds`` is given, then ``extra``."""
    budget = ["--budget.minutes", str(budget_seconds / 60)] if budget_seconds else []
    return [
        "--config",
        config,
        "--data.root",
        str(data_root),
        "--seed_everything",
        str(seed),
        "--data.num_workers",
        str(workers),
        "--trainer.default_root_dir",
        str(out),
        *budget,
        *extra,
    ]


def train_vision_tx(
    config: str, data_root: str, out: Path, seed: int, workers: int, budget_seconds: float | None, extra: Sequence[str]
) -> tuple[Any, dict[str, Any]]:
    """Trains ``config`` on ``data_root`` through vision_tx's CLI (``tools/train.py``'s ``fit``), with
    ``--budget.minutes`` when ``budget_seconds`` is given (the config's step plan stretched to it);
    returns the CLI (trainer, model, datamodule) and the summary of its :class:`TrainingBudget` clock."""
    from vision_tx.lightning.budget import TrainingBudget
    from vision_tx.lightning.cli import run_cli

    args = training_args(config, data_root, out, seed, workers, budget_seconds, extra)
    print(f"vision_tx: python tools/train.py {shlex.join(args)}", flush=True)
    cli = run_cli("fit", args)
    clock = next(c for c in cli.trainer.callbacks if isinstance(c, TrainingBudget))
    return cli, clock.summary()


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

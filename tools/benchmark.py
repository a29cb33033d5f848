"""Benchmarks vision_tx against the reference libraries, side by side in one run.

    python tools/benchmark.py                 # every benchmark on the CPU
    python tools/benchmark.py swin na2d       # some of them
    # the main job's model in onnxruntime at 320 and 640, against eager and YOLOv8n's ONNX:
    python tools/benchmark.py export --processes 1
    # the main job's training step against YOLOv8n's, then its export: both YOLO comparisons in one run
    python tools/benchmark.py main_job export --processes 1
    python tools/benchmark.py --device cuda --quick            # the GPU set, one process each (about 8 minutes, H100)
    python tools/benchmark.py --device cuda --quick --dry-run  # what it would run, on any machine

Each benchmark runs in --processes fresh processes one after another (rounds of vision_tx and the
reference interleaved in each); a row gives the medians over all rounds, the middle half of the
per-round speed-ups and the range of the per-process ones.
Needs the test extra (timm, natten, transformers): pip install -e ".[test]".
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.timing import emit_row, machine, rows_from_processes  # noqa: E402

BENCHMARKS = (
    "swin",
    "vit_convnext",
    "na2d",
    "ms_deform_attn",
    "conv",
    "matcher",
    "detr",
    "dino",
    "rtdetr",
    "upernet",
    "train",
    "compile",
    "mask2former",
    "export",
    "main_job",
    "gpu_classifiers",
)
# What ``--device cuda`` runs when no name is given: the classifiers' inference matrix, the detectors' and
# segmentors' training steps against transformers, and the two attention operators against their CUDA references.
GPU_BENCHMARKS = ("gpu_classifiers", "dino", "rtdetr", "mask2former", "upernet", "ms_deform_attn", "na2d")
CPU_ONLY = ("export",)


def plan(names: list[str], device: str, quick: bool) -> list[str]:
    """The benchmarks ``names`` (default: all, or ``GPU_BENCHMARKS`` on a GPU) and the rows of those that list them
    (a module's ``cases(quick)``), one line each: what a run would time, without running it."""
    lines = []
    for name in names or (GPU_BENCHMARKS if device.startswith("cuda") else BENCHMARKS):
        if device.startswith("cuda") and name in CPU_ONLY:
            lines.append(f"{name}: CPU only, left out on {device}")
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        cases = getattr(module, "cases", None)
        lines.append(f"{name} ({device})" + "".join(f"\n  {case.name}" for case in (cases(quick) if cases else [])))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and one process, for a smoke run")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per benchmark (default: 3)")
    parser.add_argument("--dry-run", action="store_true", help="list what would run (benchmarks, rows) and stop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one process's share
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.dry_run:
        print("\n".join(plan(args.names, args.device, args.quick)))
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device {args.device}: no CUDA device here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    if not args.worker:
        print(f"machine: {machine(args.device)}", flush=True)
    names = args.names or (GPU_BENCHMARKS if args.device.startswith("cuda") else BENCHMARKS)
    for name in names:
        if args.worker:
            for row in importlib.import_module(f"benchmarks.{name}").run(device=args.device, quick=args.quick):
                emit_row(row)
            continue
        print(f"== {name} ({args.device})", flush=True)
        command = [sys.executable, "-u", str(Path(__file__).resolve()), name, "--device", args.device, "--worker"] + (
            ["--quick"] if args.quick else []
        )
        for item in rows_from_processes(command, 1 if args.quick else args.processes):
            print(item if isinstance(item, str) else item.format(), flush=True)


if __name__ == "__main__":
    main()

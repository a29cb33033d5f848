"""Benchmarks vision_tx against the reference libraries, side by side in one run.

    python tools/benchmark.py                 # every benchmark on the CPU
    python tools/benchmark.py swin na2d       # some of them
    python tools/benchmark.py --device cuda --quick

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

from benchmarks.timing import emit_row, machine, rows_from_processes  # noqa: E402

BENCHMARKS = ("swin", "vit_convnext", "na2d", "ms_deform_attn", "detr", "dino", "rtdetr", "upernet", "train", "compile", "mask2former")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="fewer iterations and one process, for a smoke run")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per benchmark (default: 3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one process's share
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if not args.worker:
        print(f"machine: {machine()}", flush=True)
    for name in args.names or BENCHMARKS:
        if args.worker:
            for row in importlib.import_module(f"benchmarks.{name}").run(device=args.device, quick=args.quick):
                emit_row(row)
            continue
        print(f"== {name} ({args.device})", flush=True)
        command = [sys.executable, "-u", str(Path(__file__).resolve()), name, "--device", args.device, "--worker"] + (["--quick"] if args.quick else [])
        for item in rows_from_processes(command, 1 if args.quick else args.processes):
            print(item if isinstance(item, str) else item.format(), flush=True)


if __name__ == "__main__":
    main()

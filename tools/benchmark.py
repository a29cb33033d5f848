"""Benchmarks vision_tx against the reference libraries, side by side in one run.

    python tools/benchmark.py                 # every benchmark on the CPU
    python tools/benchmark.py swin na2d       # some of them
    python tools/benchmark.py --device cuda --quick

Needs the test extra (timm, natten, transformers): pip install -e ".[test]".
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCHMARKS = ("swin", "na2d", "detr", "upernet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="fewer iterations, for a smoke run")
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    for name in args.names or BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"== {name} ({args.device})", flush=True)
        for row in module.run(device=args.device, quick=args.quick):
            print(row.format(), flush=True)


if __name__ == "__main__":
    main()

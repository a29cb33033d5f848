"""Plants single-line bugs one at a time in a temporary copy of the checkout and runs the tests meant to catch them.

Each mutant is one plausible bug of the kinds a parity claim must rule out: a swapped, skipped or
dropped norm, a bias not loaded, an activation added or removed, a bias table transposed or flipped,
a threshold moved. A mutant that no test kills ("SURVIVED") means a claim the suite does not back.
The list lives in ``tests/mutants/`` (one file per area). Not part of the test suite: run it after adding
a parity claim, and add a mutant for it (see docs/TESTING.md).

    python scripts/mutants.py                 # every mutant
    python scripts/mutants.py --only swin     # mutants whose name contains "swin"
    python scripts/mutants.py --list
    python scripts/mutants.py --jobs 2       # two at once, each in its own copy
    python scripts/mutants.py --shard 1/2    # every second mutant from the first (--shard 2/2: the others)
    python scripts/mutants.py --shard 2/2 --slice 70:   # that shard from its 71st mutant on
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.mutants import MUTANTS, Mutant  # noqa: E402  (the checkout's tests package, wherever this runs from)


def copy_checkout(destination: Path) -> None:
    """Tracked and untracked, not ignored, files of the checkout into ``destination``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def run_tests(checkout: Path, tests: tuple[str, ...], timeout: float) -> tuple[bool, str]:
    """Whether the tests pass in ``checkout``, and pytest's last line."""
    env = dict(os.environ, PYTHONPATH=str(checkout), CI="true", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    # the copy sits elsewhere, so point it at this checkout's ../shared/data
    env.setdefault("VISION_TX_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    # -n 0: a few tests each, run in --jobs copies at once; pytest-xdist's workers would only add their start-up
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f}s"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode == 0, lines[-1] if lines else result.stderr.strip()[-200:]


def run_mutant(checkout: Path, mutant: Mutant, timeout: float) -> tuple[str, str]:
    """Plants ``mutant`` in ``checkout``, runs its tests, restores the file: (result, pytest's summary)."""
    path = checkout / mutant.path
    original = path.read_text()
    if original.count(mutant.before) != 1:
        return "STALE", f"the line is not in {mutant.path} exactly once: update the mutant"
    path.write_text(original.replace(mutant.before, mutant.after))
    try:
        passed, summary = run_tests(checkout, mutant.tests, timeout)
    finally:
        path.write_text(original)
    return ("SURVIVED" if passed else "killed"), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the mutants whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--baseline", action="store_true", help="first check that the unmutated tests pass")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy of the checkout")
    parser.add_argument(
        "--shard", default="1/1", help="K/N: every N-th mutant from the K-th (N processes, or machines, share the list)"
    )
    parser.add_argument(
        "--slice", default=":", help="A:B: the selection's (after --only and --shard) mutants A to B-1, to resume a run"
    )
    args = parser.parse_args()
    shard, shards = (int(n) for n in args.shard.split("/"))
    if not 1 <= shard <= shards:
        parser.error(f"--shard {args.shard}: K/N with 1 <= K <= N")
    start, _, stop = args.slice.partition(":")
    mutants = [m for m in MUTANTS if args.only in m.name][shard - 1 :: shards][
        int(start or 0) : int(stop) if stop else None
    ]
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name:50s} {mutant.path}  ->  {' '.join(mutant.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="vision_tx_mutants_") as tmp:
        checkouts = [Path(tmp) / str(job) for job in range(max(1, args.jobs))]
        for checkout in checkouts:
            copy_checkout(checkout)
        if args.baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            passed, summary = run_tests(checkouts[0], tests, args.timeout * len(tests))
            print(f"baseline: {'pass' if passed else 'FAIL'} ({summary})", flush=True)
            if not passed:
                return 2
        free = queue.SimpleQueue()
        for checkout in checkouts:
            free.put(checkout)

        def run_on_a_free_checkout(mutant: Mutant) -> tuple[str, str, float]:
            checkout = free.get()
            start = time.perf_counter()
            try:
                result, summary = run_mutant(checkout, mutant, args.timeout)
            finally:
                free.put(checkout)
            print(f"{mutant.name:50s} {result:8s} {time.perf_counter() - start:7.0f}  {summary}", flush=True)
            return result, summary, time.perf_counter() - start

        print(f"{'mutant':50s} {'result':8s} {'seconds':>7s}  tests", flush=True)
        with ThreadPoolExecutor(max_workers=len(checkouts)) as pool:
            results = list(pool.map(run_on_a_free_checkout, mutants))
    survivors = [m.name for m, (result, _, _) in zip(mutants, results) if result != "killed"]
    print(
        f"\n{len(mutants) - len(survivors)} of {len(mutants)} killed"
        + (f"; survived or stale: {survivors}" if survivors else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())

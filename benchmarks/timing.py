"""Timing helpers shared by the benchmark modules."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Row:
    """One comparison: the same work done by vision_tx and by a reference library."""

    name: str
    ours_s: float
    reference_s: float
    reference: str
    unit_items: int = 1  # images (or calls) per measured call, for throughput
    round_speedups: tuple[float, ...] = ()  # reference / ours within each interleaved round

    @property
    def speedup(self) -> float:
        return self.reference_s / self.ours_s

    def format(self) -> str:
        ips = self.unit_items / self.ours_s
        ref_ips = self.unit_items / self.reference_s
        return (
            f"{self.name:<48} vision_tx {self.ours_s * 1e3:9.1f} ms ({ips:8.1f}/s)   "
            f"{self.reference:<14} {self.reference_s * 1e3:9.1f} ms ({ref_ips:8.1f}/s)   "
            f"speed-up x{self.speedup:.2f}{self._spread()}"
        )

    def _spread(self) -> str:
        """The middle half of the per-round speed-ups: how far the machine's noise moves the ratio."""
        if len(self.round_speedups) < 4:
            return ""
        low, _, high = statistics.quantiles(self.round_speedups, n=4)
        return f" (rounds x{low:.2f}-x{high:.2f})"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def seconds_per_call(fn: Callable[[], object], device: str = "cpu", warmup: int = 2, iters: int = 5) -> float:
    """Median wall time of ``fn()`` over ``iters`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(name: str, ours: Callable[[], object], reference: Callable[[], object], reference_name: str,
            device: str = "cpu", unit_items: int = 1, warmup: int = 2, iters: int = 5) -> Row:
    """Times both callables, interleaved in rounds so that machine load hits both alike."""
    ours_t, ref_t = [], []
    for _ in range(warmup):
        ours(); reference()
    for _ in range(iters):
        ours_t.append(seconds_per_call(ours, device, warmup=0, iters=1))
        ref_t.append(seconds_per_call(reference, device, warmup=0, iters=1))
    rounds = tuple(ref / our for our, ref in zip(ours_t, ref_t))
    return Row(name, statistics.median(ours_t), statistics.median(ref_t), reference_name, unit_items, rounds)

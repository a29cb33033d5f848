"""Timing helpers shared by the benchmark modules, and the runner that repeats a benchmark in fresh processes."""

from __future__ import annotations

import json
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

_ROW_MARK = "@benchmark-row "  # how a worker process hands a row to its parent, one JSON line each


@dataclass
class Row:
    """One comparison: the same work done by vision_tx and by a reference library, in interleaved rounds."""

    name: str
    ours_times: tuple[float, ...]  # seconds per call, one per round
    reference_times: tuple[float, ...]
    reference: str
    unit_items: int = 1  # images (or calls) per measured call, for throughput
    process_speedups: tuple[float, ...] = ()  # each process's speed-up, when merged from several
    ours_peak_bytes: int | None = None  # peak CUDA memory allocated during one call (see peak_bytes); None off the GPU
    reference_peak_bytes: int | None = None

    @property
    def ours_s(self) -> float:
        return statistics.median(self.ours_times)

    @property
    def reference_s(self) -> float:
        return statistics.median(self.reference_times)

    @property
    def speedup(self) -> float:
        return self.reference_s / self.ours_s

    @property
    def round_speedups(self) -> tuple[float, ...]:
        return tuple(ref / our for our, ref in zip(self.ours_times, self.reference_times))

    @staticmethod
    def merge(rows: Sequence[Row]) -> Row:
        """The same comparison run in several processes: all their rounds, each one's speed-up and the
        largest of their peaks (if every process measured one)."""
        first = rows[0]

        def largest(peaks: list[int | None]) -> int | None:
            return None if None in peaks else max(peaks)

        return Row(
            first.name,
            sum((r.ours_times for r in rows), ()),
            sum((r.reference_times for r in rows), ()),
            first.reference,
            first.unit_items,
            tuple(r.speedup for r in rows),
            largest([r.ours_peak_bytes for r in rows]),
            largest([r.reference_peak_bytes for r in rows]),
        )

    def format(self) -> str:
        ips = self.unit_items / self.ours_s
        ref_ips = self.unit_items / self.reference_s
        return (
            f"{self.name:<48} vision_tx {self.ours_s * 1e3:9.1f} ms ({ips:8.1f}/s)   "
            f"{self.reference:<14} {self.reference_s * 1e3:9.1f} ms ({ref_ips:8.1f}/s)   "
            f"speed-up x{self.speedup:.2f}{self._spread()}{self._peaks()}"
        )

    def _peaks(self) -> str:
        """Both sides' peak memory and their ratio (vision_tx / reference), where measured (on a GPU)."""
        if self.ours_peak_bytes is None or self.reference_peak_bytes is None:
            return ""
        gib = 2**30
        return (
            f"   peak {self.ours_peak_bytes / gib:.2f} GiB vs {self.reference_peak_bytes / gib:.2f} GiB, "
            f"x{self.ours_peak_bytes / self.reference_peak_bytes:.2f}"
        )

    def _spread(self) -> str:
        """The middle half of the per-round speed-ups (how far the machine's noise moves the ratio) and
        the range of the per-process ones (how far a process's memory layout moves it)."""
        parts = []
        if len(self.round_speedups) >= 4:
            low, _, high = statistics.quantiles(self.round_speedups, n=4)
            parts.append(f"rounds x{low:.2f}-x{high:.2f}")
        if len(self.process_speedups) > 1:
            parts.append(
                f"{len(self.process_speedups)} processes "
                f"x{min(self.process_speedups):.2f}-x{max(self.process_speedups):.2f}"
            )
        return f" ({'; '.join(parts)})" if parts else ""


def synchronize(device: str) -> None:
    """Waits for ``device``'s queued work (a no-op off the GPU): what a wall-clock time on a GPU needs."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def peak_bytes(fn: Callable[[], object], device: str) -> int | None:
    """The peak CUDA memory allocated on ``device`` during one call of ``fn`` (everything resident counts,
    both sides' models included), or None off the GPU."""
    if not device.startswith("cuda"):
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def seconds_per_call(fn: Callable[[], object], device: str = "cpu", warmup: int = 2, iters: int = 5) -> float:
    """Median wall time of ``fn()`` over ``iters`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine(device: str = "cpu") -> str:
    """What every timing names: the CPU model and its widest vector extensions, the threads torch uses and
    torch's version (ratios against MKL-based references change with the CPU's vendor; docs/BENCHMARKS.md);
    on a GPU (``device`` ``cuda``...) also the GPU's name and torch's CUDA version."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        text = cpuinfo.read_text()
        name, found = re.search(r"^model name\s*:\s*(.+)$", text, re.M), re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        model, flags = (name[1] if name else model), set(found[1].split() if found else ())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    vector += ", AMX" if "amx_tile" in flags else ""
    cpu = f"{model} ({vector}), {torch.get_num_threads()} threads, torch {torch.__version__}"
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}; {cpu}"
    return cpu


def compare(
    name: str,
    ours: Callable[[], object],
    reference: Callable[[], object],
    reference_name: str,
    device: str = "cpu",
    unit_items: int = 1,
    warmup: int = 2,
    iters: int = 5,
) -> Row:
    """Times both callables, interleaved in rounds so that machine load hits both alike; on a GPU then
    measures each one's peak memory over one more call (:func:`peak_bytes`)."""
    ours_t, ref_t = [], []
    for _ in range(warmup):
        ours()
        reference()
    for _ in range(iters):
        ours_t.append(seconds_per_call(ours, device, warmup=0, iters=1))
        ref_t.append(seconds_per_call(reference, device, warmup=0, iters=1))
    return Row(
        name,
        tuple(ours_t),
        tuple(ref_t),
        reference_name,
        unit_items,
        ours_peak_bytes=peak_bytes(ours, device),
        reference_peak_bytes=peak_bytes(reference, device),
    )


def classifier_training_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor
) -> None:
    """One training step: ``model(images [N,3,H,W]) -> logits [N,K]``, cross-entropy with ``labels [N]``,
    backward, ``optimizer.step()``."""
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()
    optimizer.step()


def emit_row(row: Row) -> None:
    """Prints ``row`` for a parent process (see :func:`rows_from_processes`)."""
    print(_ROW_MARK + json.dumps(asdict(row)), flush=True)


def rows_from_processes(command: Sequence[str], processes: int) -> Iterator[str | Row]:
    """Runs ``command`` (a worker that prints rows with :func:`emit_row`) ``processes`` times, one after
    another, passing its other output lines through; then yields each row merged over the processes.

    Why several processes: where a process's heap and pages land moves a CPU model's speed by up to
    10-20% for the whole life of that process (glibc hands large blocks back and faults them in again),
    so interleaved rounds in one process agree with each other more than with the next run.
    """
    per_process: list[list[Row]] = []
    for index in range(processes):
        rows = []
        # stdout is read as it comes (lines pass through while the worker runs); stderr goes straight to ours.
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1]
        ) as worker:
            for line in worker.stdout:
                line = line.rstrip("\n")
                if line.startswith(_ROW_MARK):
                    fields = json.loads(line[len(_ROW_MARK) :])
                    rows.append(Row(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}))
                else:
                    yield f"[process {index + 1}/{processes}] {line}"
        if worker.returncode != 0:
            raise RuntimeError(f"benchmark worker {' '.join(command)} failed with exit status {worker.returncode}")
        per_process.append(rows)
    for rows in zip(*per_process, strict=True):
        yield Row.merge(rows)

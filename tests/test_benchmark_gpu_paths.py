"""The benchmarks' GPU paths run on the CPU: torch.cuda's memory counters and synchronisation faked, so that
``compare(..., device="cuda")`` measures (fake) peaks and rows carry, format and hand them up."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks.timing import Row, compare, peak_bytes, rows_from_processes

GIB = 2**30


class FakeCudaMemory:
    """``torch.cuda``'s peak counter as a number that the timed callables set: ``allocate(n)`` raises the peak."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.peak, self.resets, self.synchronized = 0, 0, []
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self._reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.synchronized.append(device))

    def _reset(self, device: str | None = None) -> None:
        self.peak, self.resets = 0, self.resets + 1

    def allocate(self, nbytes: int) -> None:
        self.peak = max(self.peak, nbytes)


def test_compare_on_cuda_measures_each_sides_peak_of_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = FakeCudaMemory(monkeypatch)
    row = compare(
        "step",
        lambda: memory.allocate(3 * GIB),
        lambda: memory.allocate(4 * GIB),
        "ref",
        device="cuda",
        warmup=1,
        iters=2,
    )
    assert (row.ours_peak_bytes, row.reference_peak_bytes) == (3 * GIB, 4 * GIB)
    assert memory.resets == 2 and set(memory.synchronized) == {"cuda"}
    assert row.format().endswith("   peak 3.00 GiB vs 4.00 GiB, x0.75")


def test_on_the_cpu_nothing_is_measured_and_the_line_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = FakeCudaMemory(monkeypatch)
    row = compare("step", lambda: memory.allocate(GIB), lambda: None, "ref", device="cpu", warmup=0, iters=1)
    assert row.ours_peak_bytes is None and row.reference_peak_bytes is None and peak_bytes(lambda: None, "cpu") is None
    assert memory.resets == 0 and memory.synchronized == []
    assert "peak" not in row.format()


def test_peaks_survive_the_hand_off_between_processes_and_merge_to_the_largest() -> None:
    worker = (
        f"from benchmarks.timing import Row, emit_row\n"
        f"import sys\n"
        f"emit_row(Row('step', (1.0,), (2.0,), 'ref', ours_peak_bytes={GIB} * int(sys.argv[1]), "
        f"reference_peak_bytes={2 * GIB}))\n"
        f"emit_row(Row('cpu', (1.0,), (2.0,), 'ref'))\n"
    )
    (row, cpu_row) = list(rows_from_processes([sys.executable, "-c", worker, "3"], processes=1))
    assert (row.ours_peak_bytes, row.reference_peak_bytes) == (
        3 * GIB,
        2 * GIB,
    ) and "peak 3.00 GiB vs 2.00 GiB, x1.50" in row.format()
    assert cpu_row.ours_peak_bytes is None and "peak" not in cpu_row.format()
    merged = Row.merge([row, Row("step", (1.0,), (2.0,), "ref", ours_peak_bytes=GIB, reference_peak_bytes=5 * GIB)])
    assert (merged.ours_peak_bytes, merged.reference_peak_bytes) == (3 * GIB, 5 * GIB)
    assert Row.merge([row, Row("step", (1.0,), (2.0,), "ref")]).ours_peak_bytes is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ms_deform_attn", "na2d"])
def test_the_light_gpu_benchmarks_run_on_the_device_they_are_given(name: str) -> None:
    """The quick run of a GPU benchmark light enough for one CPU core (about 15 s each): rows, no peaks."""
    import importlib

    rows = importlib.import_module(f"benchmarks.{name}").run(device="cpu", quick=True)
    assert rows and all(row.ours_s > 0 and row.reference_s > 0 and row.ours_peak_bytes is None for row in rows)

"""The benchmark runner's arithmetic: rows merged over processes, and rows handed up from worker processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from benchmarks.timing import Row, rows_from_processes

_WORKER = """
from benchmarks.timing import Row, emit_row
print("setting up")
emit_row(Row("forward", (1.0, 2.0, 3.0), (2.0, 4.0, 3.0), "ref", unit_items=4))
emit_row(Row("backward", (1.0,), (0.5,), "ref"))
"""


def test_rows_merge_rounds_and_keep_each_process_speedup() -> None:
    fast = Row("f", (1.0, 1.0, 2.0), (2.0, 2.0, 2.0), "ref", unit_items=8)
    slow = Row("f", (1.0, 3.0, 3.0), (3.0, 3.0, 3.0), "ref", unit_items=8)
    merged = Row.merge([fast, slow])
    assert merged.ours_times == (1.0, 1.0, 2.0, 1.0, 3.0, 3.0)
    assert merged.ours_s == 1.5 and merged.reference_s == 2.5
    assert merged.process_speedups == (2.0, 1.0)
    assert merged.round_speedups == (2.0, 2.0, 1.0, 3.0, 1.0, 1.0)
    line = merged.format()
    assert "speed-up x1.67" in line and "2 processes x1.00-x2.00" in line and "(     5.3/s)" in line


def test_rows_from_worker_processes_are_merged_in_order() -> None:
    items = list(rows_from_processes([sys.executable, "-c", _WORKER], processes=2))
    assert items[:2] == ["[process 1/2] setting up", "[process 2/2] setting up"]
    forward, backward = items[2:]
    assert forward.name == "forward" and forward.ours_times == (1.0, 2.0, 3.0) * 2 and forward.unit_items == 4
    assert forward.process_speedups == (1.5, 1.5)
    assert backward.speedup == 0.5


def test_a_failing_worker_is_reported() -> None:
    with pytest.raises(RuntimeError, match="failed with exit status 3"):
        list(rows_from_processes([sys.executable, "-c", "import sys; sys.exit(3)"], processes=1))


def test_the_machine_line_names_cpu_vector_extensions_threads_and_torch() -> None:
    import torch

    from benchmarks.timing import machine

    line = machine()
    assert f"{torch.get_num_threads()} threads, torch {torch.__version__}" in line
    assert any(ext in line for ext in ("AVX-512", "AVX2", "no AVX2"))


def test_saved_for_backward_counts_each_kept_storage_once() -> None:
    """A product keeps both operands and ReLU its output; an operand kept twice counts once."""
    import torch

    from benchmarks.mask2former import saved_for_backward_bytes

    a = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(8, 16, requires_grad=True)
    total, largest = saved_for_backward_bytes(lambda: (a @ b).relu().sum() + (a * a).sum())
    assert (total, largest) == (4 * (4 * 8 + 8 * 16 + 4 * 16), 4 * 8 * 16)


def test_the_gpu_run_lists_its_cases_on_a_cpu_and_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """``tools/benchmark.py --device cuda --quick``: its plan is built here (every module imported, the classifier
    rows listed), and without a GPU the run stops with one line."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from benchmark import GPU_BENCHMARKS, main

    main(["--device", "cuda", "--quick", "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines if not line.startswith(" ")] == list(GPU_BENCHMARKS)
    assert sum("classifier, batch 64" in line for line in lines) == 8  # 3 models x fp32/bf16, Swin-T also compiled
    assert any("swin_t" in line and "bf16" in line and "compiled" in line for line in lines)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device here"):
            main(["--device", "cuda", "--quick"])

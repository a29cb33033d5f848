"""Checkpoints are replaced atomically: a save that fails or is killed half-way keeps the previous file whole."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from vision_tx.lightning.checkpoint_io import AtomicCheckpointIO

ROOT = Path(__file__).resolve().parents[2]


class FailsWhenSaved:
    """Pickling it raises: a failure in the middle of ``torch.save``."""

    def __reduce__(self):
        raise OSError("disk full")


def checkpoint(step: int, size: int = 1024) -> dict:
    """A Lightning-shaped checkpoint of ``4 * size**2`` bytes of weights, all equal to ``step``."""
    return {
        "pytorch-lightning_version": "2.6.6",
        "global_step": step,
        "state_dict": {"weight": torch.full((size, size), float(step))},
    }


def assert_holds_step(path: Path, step: int, size: int = 1024) -> None:
    loaded = AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    assert loaded["global_step"] == step and torch.equal(
        loaded["state_dict"]["weight"], checkpoint(step, size)["state_dict"]["weight"]
    )
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_a_save_that_fails_half_way_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(checkpoint(1), path)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({**checkpoint(2), "z": FailsWhenSaved()}, path)
    assert_holds_step(path, 1)
    io.save_checkpoint(checkpoint(3), path)
    assert_holds_step(path, 3)
    with tempfile.TemporaryDirectory() as folder:  # the usual permissions, not mkstemp's private 0600
        plain = Path(folder) / "plain"
        plain.write_bytes(b"")
        assert oct(path.stat().st_mode) == oct(plain.stat().st_mode)


def test_a_process_killed_while_saving_keeps_a_whole_checkpoint(tmp_path: Path) -> None:
    """A process rewrites ``last.ckpt`` in a loop and is killed with SIGKILL while a write is half done."""
    path = tmp_path / "last.ckpt"
    script = (
        "import itertools, pathlib\n"
        "from tests.lightning.test_checkpoint_io import AtomicCheckpointIO, checkpoint\n"
        "for step in itertools.count(1):\n"
        f"    AtomicCheckpointIO().save_checkpoint(checkpoint(step), pathlib.Path({str(path)!r}))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not a_write_is_half_done(tmp_path):
            assert time.monotonic() < deadline and process.poll() is None, "the writer never got half-way"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    for leftover in tmp_path.glob(".last.ckpt.*.tmp"):  # what the killed write left
        leftover.unlink()
    loaded = AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    assert_holds_step(path, loaded["global_step"])


def a_write_is_half_done(folder: Path) -> bool:
    """Whether ``last.ckpt`` exists and a temporary file beside it already holds over 1 MiB."""
    if not (folder / "last.ckpt").exists():
        return False
    for temporary in folder.glob(".last.ckpt.*.tmp"):
        try:
            if temporary.stat().st_size > 2**20:
                return True
        except FileNotFoundError:  # renamed while looked at
            pass
    return False

"""Running the scripts of ``tools/`` from the tests: in a new process, or in this one.

A new process is what a user runs, and what DDP, SIGKILL and exit statuses need; each one costs seconds
of importing torch and Lightning. A one-process run of the same script in this process (``runpy``, with
the script's own arguments) costs none of that: the tests use it where no process boundary is checked.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# The loggers whose records a new process prints on its console: Lightning's (rank_zero_info and co.).
CONSOLE_LOGGERS = ("lightning.pytorch", "lightning.fabric")


def run_tool(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Runs ``tools/<tool>`` with ``args`` in a new Python process in ``cwd``; asserts it succeeds."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / tool), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def run_tool_in_process(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Runs ``tools/<tool>`` as ``__main__`` in this process, in ``cwd``, as :func:`run_tool` does in a new
    one (on one process only: a DDP run would relaunch pytest). Its stdout, and on stderr Lightning's log
    and the warnings, are returned as a process's would be. What a run changes for the whole process is
    put back: the environment (Lightning's ``PL_GLOBAL_SEED``), the working directory, ``sys.argv``,
    torch's thread count (``OMP_NUM_THREADS``, when set, applies as in a new process) and deterministic mode."""
    environment, folder, argv = dict(os.environ), Path.cwd(), sys.argv
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    command, stdout, stderr = [str(ROOT / "tools" / tool), *args], io.StringIO(), io.StringIO()
    console = logging.StreamHandler(stderr)
    try:
        os.chdir(cwd)
        sys.argv = command
        if "OMP_NUM_THREADS" in os.environ:
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        for name in CONSOLE_LOGGERS:
            logging.getLogger(name).addHandler(console)
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("default")  # a new process's filters: each warning once per place
            runpy.run_path(command[0], run_name="__main__")
    finally:
        for name in CONSOLE_LOGGERS:
            logging.getLogger(name).removeHandler(console)
        os.environ.clear()
        os.environ.update(environment)
        os.chdir(folder)
        sys.argv = argv
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    return subprocess.CompletedProcess(command, 0, stdout.getvalue(), stderr.getvalue() + shown)

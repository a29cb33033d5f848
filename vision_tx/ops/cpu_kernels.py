"""vision_tx's C++ CPU kernels (``vision_tx/ops/csrc``: deformable attention, a depthwise convolution's weight
gradient), compiled on first use with the machine's C++ compiler (``torch.utils.cpp_extension``, ninja from the
``ninja`` package) into one library, and cached.

Where no compiler works (or ``VISION_TX_CPU_KERNELS=0``), :func:`cpu_kernels` returns None and the operators run
their PyTorch version: the same results, slower. The build is cached per source, torch and Python version under
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``): the compiler runs once per machine (about 30 s),
not per process. Each process builds in a folder of its own and moves the finished build into place, so concurrent
first runs never wait on each other's lock, and a run killed while compiling leaves nothing that blocks the next.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(CSRC.glob("*.cpp"))  # compiled into one library
HEADERS = sorted(CSRC.glob("*.h"))  # included by them
MODULE_NAME = "vision_tx_cpu_kernels"
ENV_SWITCH = "VISION_TX_CPU_KERNELS"
_PLAIN = (torch.Tensor, torch.nn.Parameter)
logger = logging.getLogger(__name__)


def kernel_inputs(*tensors: torch.Tensor) -> bool:
    """Whether ``tensors`` may go to a kernel: plain CPU tensors or parameters (no other subclass) of one float32 /
    float64 dtype, outside compiled or exported code and dispatch modes (which must see aten operators)."""
    dtype = tensors[0].dtype
    return (
        dtype in (torch.float32, torch.float64)
        and all(type(x) in _PLAIN and x.device.type == "cpu" and x.dtype == dtype for x in tensors)
        and not torch.compiler.is_compiling()
        and not is_in_torch_dispatch_mode()
    )


def _compiler_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags: optimised, and parallel through OpenMP where the compiler is GCC-like on Linux (torch's
    ``at::parallel_for`` is compiled into the kernel and needs it; torch's own OpenMP runtime is the one loaded)."""
    if sys.platform.startswith("linux"):
        return ["-O3", "-fopenmp"], ["-fopenmp"]
    if sys.platform == "win32":
        return ["/O2", "/openmp"], []
    return ["-O3"], []  # macOS's clang has no OpenMP: the kernel runs on one thread


def build_directory(sources: list[Path] = SOURCES + HEADERS) -> Path:
    """Where the library built from ``sources`` (and the headers they include) is cached: one folder per source text,
    torch and Python version (a newer torch or an edited source or header builds afresh, never loads a stale
    binary)."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    key = hashlib.sha256()
    for source in sources:
        key.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    key.update(torch.__version__.encode() + str(sysconfig.get_config_var("SOABI")).encode())
    return root / f"{MODULE_NAME}_{key.hexdigest()[:16]}"


def _library(directory: Path) -> Path:
    return directory / f"{MODULE_NAME}{'.pyd' if sys.platform == 'win32' else '.so'}"  # cpp_extension's naming


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(directory: Path) -> ModuleType:
    """Compiles the kernels in a private folder beside ``directory``, loads it and moves the folder to ``directory``."""
    cpp_logger = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_logger.level
    cpp_logger.setLevel(logging.ERROR)  # "No CUDA runtime is found" on CPU-only machines, at import
    try:
        from torch.utils.cpp_extension import load
    finally:
        cpp_logger.setLevel(level)
    logger.warning("compiling vision_tx's C++ CPU kernels into %s (once, about 30 s)", directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f"{directory.name}.building-"))
    path = os.environ.get("PATH", "")
    try:
        try:  # the ninja package's binary, also where its environment's bin/ is not on PATH
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
        except ImportError:
            pass
        cflags, ldflags = _compiler_flags()
        module = load(
            MODULE_NAME,
            [str(source) for source in SOURCES],
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            build_directory=str(private),
            is_python_module=True,
        )
        try:
            private.rename(directory)
        except OSError:  # another process finished first: its build is the same
            shutil.rmtree(private, ignore_errors=True)
        return module
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    finally:
        os.environ["PATH"] = path


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled kernels (``ms_deform_attn_forward`` and ``_backward``, ``depthwise_conv2d_weight_grad``), or None
    where they are switched off (``VISION_TX_CPU_KERNELS=0``) or fail to build (a warning says why, once)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    directory = build_directory()
    try:
        library = _library(directory)
        return _import(library) if library.exists() else _build(directory)
    except Exception as error:  # no compiler, no Python headers, an unwritable cache: the PyTorch version runs
        message = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
        warnings.warn(
            f"vision_tx: the C++ CPU kernels did not build or load ({type(error).__name__}: {message}); the "
            f"operators' PyTorch versions run instead (slower). Set {ENV_SWITCH}=0 to skip the attempt.",
            stacklevel=2,
        )
        return None

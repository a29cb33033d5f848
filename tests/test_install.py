"""A wheel built from the checkout, installed in a fresh virtual environment outside it, finds its configs by
name (``vision-tx train --config rtdetr_convnext_toy --trainer.max_steps 2`` trains from the installed package) and
builds its C++ CPU kernel from the source it ships."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], cwd: Path) -> str:
    """Runs ``command`` in ``cwd`` without the checkout on the path; asserts it succeeds; its stdout."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result.stdout


def running_site_packages() -> list[str]:
    """The folders this interpreter imports installed packages from (a venv's, the system's, the user's)."""
    folders = [*site.getsitepackages(), site.getusersitepackages(), *sysconfig.get_paths().values()]
    folders += [entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))]
    return list(
        dict.fromkeys(
            folder
            for folder in folders
            if folder.endswith(("site-packages", "dist-packages")) and Path(folder).is_dir()
        )
    )


def test_an_installed_wheel_trains_a_config_by_name(tmp_path: Path) -> None:
    # The build runs in a copy, so that it leaves no build/ or egg-info folder in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "vision_tx", source / "vision_tx", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        tmp_path,
    )
    wheel = next((tmp_path / "dist").glob("vision_tx-*.whl"))
    # torch and the other dependencies come from the running interpreter's site-packages, whether it runs in a virtual
    # environment or not (system_site_packages would expose the base interpreter's, not a venv's); the package from the
    # wheel, which the new environment's own site-packages puts first on the path.
    venv.create(tmp_path / "venv", with_pip=False)
    python, bin_dir = tmp_path / "venv" / "bin" / "python", tmp_path / "venv" / "bin"
    venv_site = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip()
    )
    (venv_site / "running_interpreter.pth").write_text("\n".join(running_site_packages()) + "\n")
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        tmp_path,
    )

    work = tmp_path / "work"
    work.mkdir()
    installed = Path(run([str(python), "-c", "import vision_tx; print(vision_tx.__file__)"], work).strip())
    assert installed.is_relative_to(tmp_path / "venv"), installed  # not the checkout, not an editable install
    assert (installed.parent / "configs" / "rtdetr_convnext_toy.yaml").is_file()
    # The C++ kernels' sources ship and build (or load from the cache) in the installed package
    for source in ("bindings.cpp", "ms_deform_attn_cpu.cpp", "depthwise_conv_cpu.cpp", "vector_clones.h"):
        assert (installed.parent / "ops" / "csrc" / source).is_file()
    run(
        [str(python), "-W", "error", "-c", "from vision_tx.ops.cpu_kernels import cpu_kernels; assert cpu_kernels()"],
        work,
    )
    run(
        [
            str(bin_dir / "vision-tx"),
            "train",
            "--config",
            "rtdetr_convnext_toy",
            "--trainer.max_steps",
            "2",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.enable_progress_bar",
            "false",
        ],
        work,
    )
    assert list((work / "runs" / "rtdetr_convnext_toy").rglob("last.ckpt"))

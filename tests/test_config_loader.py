"""Every shipped config means what it meant when ``tests/fixtures/resolved_configs.json`` was written (a recipe changed
on purpose rewrites it: ``python -m vision_tx.config_loader --all > tests/fixtures/resolved_configs.json``); the
``__base__`` rules of ``vision_tx/config_loader.py``: order, override, lists replaced, missing bases, circles; the
command line reads them and ``--print_config`` shows the merged config."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from vision_tx.config_loader import ConfigError, load_config, main, merge, resolved_configs
from vision_tx.lightning.cli import train_main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "resolved_configs.json").read_text())
RESOLVED = resolved_configs()


def test_the_fixture_names_every_config_and_no_other() -> None:
    assert len(FIXTURE) == 47 and sorted(RESOLVED) == sorted(FIXTURE)


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_each_config_resolves_to_the_fixture(name: str) -> None:
    """Compared as sorted JSON, so that 1 and 1.0, or 1 and true, differ."""
    assert json.dumps(RESOLVED[name], sort_keys=True, indent=1) == json.dumps(FIXTURE[name], sort_keys=True, indent=1)


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_each_resolved_config_reads_back_from_the_yaml_the_command_line_parses(name: str) -> None:
    """The command line hands jsonargparse the merged config as YAML text: nothing changes on the way."""
    text = yaml.safe_dump(RESOLVED[name], sort_keys=False)
    assert json.dumps(yaml.safe_load(text), sort_keys=True) == json.dumps(RESOLVED[name], sort_keys=True)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_bases_merge_in_order_each_over_the_ones_before_and_the_file_over_them_all(tmp_path: Path) -> None:
    write(
        tmp_path,
        "a.yaml",
        "model: {init_args: {lr: 1.0, backbone: swin_t, kwargs: {x: 1, y: 2}}}\ntrainer: {callbacks: [A, B]}\n",
    )
    write(tmp_path, "b.yaml", "model: {init_args: {lr: 2.0, kwargs: {y: 3}}}\ntrainer: {max_steps: 5}\n")
    child = write(
        tmp_path,
        "child.yaml",
        "# header\n__base__: [a.yaml, b.yaml]\nmodel: {init_args: {backbone: swin_s}}\ntrainer: {callbacks: [C]}\n",
    )
    assert load_config(child) == {
        "model": {"init_args": {"lr": 2.0, "backbone": "swin_s", "kwargs": {"x": 1, "y": 3}}},
        "trainer": {"callbacks": ["C"], "max_steps": 5},  # a list is replaced, not appended to
    }
    write(tmp_path, "reversed.yaml", "__base__: [b.yaml, a.yaml]\n")
    assert load_config(tmp_path / "reversed.yaml")["model"]["init_args"]["lr"] == 1.0
    assert merge({"a": {"b": 1}, "c": [1]}, {"a": 2, "c": [2, 3]}) == {"a": 2, "c": [2, 3]}
    assert merge({"a": None}, {"a": {"b": 1}}) == {"a": {"b": 1}}


def test_a_base_is_found_from_the_folder_of_the_file_that_names_it_and_may_have_bases(tmp_path: Path) -> None:
    write(tmp_path, "bases/inner/schedule.yaml", "trainer: {max_epochs: 12, gradient_clip_val: 0.1}\n")
    write(tmp_path, "bases/task.yaml", "__base__: inner/schedule.yaml\ntrainer: {max_epochs: 50}\n")
    child = write(tmp_path, "configs/mine.yaml", "__base__: [../bases/task.yaml]\n")
    assert load_config(child) == {"trainer": {"max_epochs": 50, "gradient_clip_val": 0.1}}
    # The same base reached twice (a diamond) is no circle.
    write(tmp_path, "configs/twice.yaml", "__base__: [../bases/task.yaml, ../bases/inner/schedule.yaml]\n")
    assert load_config(tmp_path / "configs/twice.yaml") == {"trainer": {"max_epochs": 12, "gradient_clip_val": 0.1}}


def test_a_base_without_yaml_suffix_is_a_config_name_as_config_takes_it(tmp_path: Path) -> None:
    child = write(tmp_path, "mine.yaml", "__base__: [dino_swin_s]\nmodel: {init_args: {backbone: swin_b}}\n")
    resolved = load_config(child)
    assert resolved["model"]["init_args"]["backbone"] == "swin_b"
    assert resolved["trainer"] == FIXTURE["dino_swin_s"]["trainer"]


def test_a_missing_base_is_an_error_naming_the_file_that_names_it(tmp_path: Path) -> None:
    write(tmp_path, "middle.yaml", "__base__: [gone/away.yaml]\n")
    child = write(tmp_path, "child.yaml", "__base__: [middle.yaml]\n")
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'middle.yaml'}: its base 'gone/away.yaml' does not exist"):
        load_config(child)
    write(tmp_path, "named.yaml", "__base__: [no_such_config]\n")
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'named.yaml'}: its base 'no_such_config' is no config name"):
        load_config(tmp_path / "named.yaml")


def test_a_circle_of_bases_is_an_error_showing_the_circle(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "__base__: [b.yaml]\n")
    write(tmp_path, "b.yaml", "__base__: [./a.yaml]\n")
    with pytest.raises(ConfigError, match="circle: .*a.yaml -> .*b.yaml -> .*a.yaml$"):
        load_config(tmp_path / "a.yaml")
    write(tmp_path, "self.yaml", "__base__: self.yaml\n")
    with pytest.raises(ConfigError, match="circle"):
        load_config(tmp_path / "self.yaml")


@pytest.mark.parametrize("value", ["{a: 1}", "[1]", "['']", "null"])
def test_a_malformed_base_key_is_an_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="__base__ is a list of config names or YAML files"):
        load_config(write(tmp_path, "bad.yaml", f"__base__: {value}\n"))


def print_config(argv: list[str]) -> dict:
    """What ``tools/train.py ARGV --print_config`` prints, read back."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as stopped:
        train_main([*argv, "--print_config"])
    assert stopped.value.code in (0, None)
    return yaml.safe_load(printed.getvalue())


def test_the_command_line_reads_the_bases_and_print_config_shows_them_merged(tmp_path: Path, monkeypatch) -> None:
    write(
        tmp_path,
        "bases/base.yaml",
        "model:\n  class_path: vision_tx.lightning.detection.DetectionModule\n"
        "  init_args: {backbone: swin_t, detector: dino, lr: 3.0e-4}\n"
        "trainer: {max_epochs: 7}\n",
    )
    child = write(tmp_path, "child.yaml", "__base__: [bases/base.yaml]\nmodel: {init_args: {backbone: swin_s}}\n")
    monkeypatch.chdir(tmp_path / "bases")  # bases are found from the file's folder, not the working directory
    printed = print_config(["--config", str(child), "--model.lr", "5.0e-4"])
    assert printed["model"]["class_path"] == "vision_tx.lightning.detection.DetectionModule"
    assert {k: printed["model"]["init_args"][k] for k in ("backbone", "detector", "lr")} == {
        "backbone": "swin_s",
        "detector": "dino",
        "lr": 5.0e-4,
    }
    assert printed["trainer"]["max_epochs"] == 7


def test_the_command_line_names_a_missing_base_and_its_file(tmp_path: Path) -> None:
    child = write(tmp_path, "child.yaml", "__base__: [missing.yaml]\n")
    with pytest.raises(SystemExit, match=rf"^error: {child}: its base 'missing.yaml' does not exist"):
        train_main(["--config", str(child)])


def test_the_module_prints_a_config_with_its_bases_merged(capsys) -> None:
    main(["dino_swin_s"])
    assert yaml.safe_load(capsys.readouterr().out) == FIXTURE["dino_swin_s"]


def test_print_config_of_a_shipped_config_shows_its_bases_merged() -> None:
    """``dino_swin_s`` sets two values; the printed config has its bases' classes, schedule and callbacks."""
    printed = print_config(["--config", "dino_swin_s"])
    expected = FIXTURE["dino_swin_s"]
    assert (printed["model"]["class_path"], printed["data"]["class_path"]) == (
        expected["model"]["class_path"],
        expected["data"]["class_path"],
    )
    assert {k: printed["model"]["init_args"][k] for k in expected["model"]["init_args"]} == expected["model"][
        "init_args"
    ]
    assert {k: printed["trainer"][k] for k in ("max_epochs", "gradient_clip_val", "log_every_n_steps")} == {
        "max_epochs": 12,
        "gradient_clip_val": 0.1,
        "log_every_n_steps": 50,
    }
    assert [c["class_path"] for c in printed["trainer"]["callbacks"]] == [
        "lightning.pytorch.callbacks.ModelCheckpoint",
        "vision_tx.lightning.callbacks.LatestCheckpoint",
    ]

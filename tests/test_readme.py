"""The README's commands and examples stay honest: the set-up commands as written, every config,
tool and test it names exists, the "Backbones in your own project" examples run with the shapes they
state; and the tables moved to docs/ name tests that exist. The guides stay short enough to read: the
README, each page of docs/ and each config's comment header have a length cap."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import torch

from vision_tx.backbones import build_classifier

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
CONFIGS = sorted((ROOT / "vision_tx" / "configs").glob("*.yaml"))
SETUP_COMMANDS = (
    "pip install -e . && python tools/train.py --config rtdetr_convnext_toy",
    'pip install -e ".[test]" && python -m pytest -q',
)


def _section(text: str, section: str) -> str:
    return text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]


def _python_blocks(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", _section(README.read_text(), section), flags=re.DOTALL)


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (their fences left out)."""
    prose, in_code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            prose.append(line)
    return prose


def test_setup_commands_are_verbatim_and_the_readme_is_a_guide() -> None:
    text = README.read_text()
    for command in SETUP_COMMANDS:
        assert f"```bash\n{command}\n```" in _section(text, "Set-up"), command
    assert len(text.splitlines()) <= 300  # a guide; figures' history lives in docs/
    assert not [line for line in text.splitlines() if len(line) > 400]
    assert not [line for line in _prose_lines(text) if len(line) > 200]  # prose and tables; commands may run longer


@pytest.mark.parametrize("page", DOCS)
def test_each_docs_page_is_at_most_600_lines(page: str) -> None:
    assert len((ROOT / "docs" / page).read_text().splitlines()) <= 600  # history beyond that lives in git


def _comment_header(config: Path) -> list[str]:
    """The comment lines before a config's first key."""
    lines = config.read_text().splitlines()
    return lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]


def test_each_config_header_is_at_most_15_lines() -> None:
    lengths = {config.name: len(_comment_header(config)) for config in CONFIGS}
    assert len(lengths) > 40 and all(lengths.values()), lengths  # every config has a header
    assert not {
        name: n for name, n in lengths.items() if n > 15
    }  # what it trains, batch, schedule, why, where the evidence is


def _expand(name: str) -> list[str]:
    """``upernet_swin_{t,s}_ade20k`` -> ``upernet_swin_t_ade20k``, ``upernet_swin_s_ade20k``."""
    match = re.search(r"\{([^}]*)\}", name)
    if not match:
        return [name]
    return [n for part in match[1].split(",") for n in _expand(name[: match.start()] + part + name[match.end() :])]


def test_configs_and_tools_named_exist() -> None:
    text = README.read_text()
    table_rows = [
        line for line in _section(text, "Training and evaluating on your data").splitlines() if line.startswith("| `")
    ]
    configs = set(re.findall(r"--config (\w+)", text))
    configs |= {
        n for row in table_rows for name in re.findall(r"`([\w{},]+)`", row.split("|")[1]) for n in _expand(name)
    }
    missing = sorted(name for name in configs if not (ROOT / "vision_tx" / "configs" / f"{name}.yaml").exists())
    assert len(configs) > 20 and not missing, missing
    tools = set(re.findall(r"python (tools/\w+\.py|scripts/\w+\.py)", text))
    assert tools and not [tool for tool in tools if not (ROOT / tool).exists()]


@pytest.mark.parametrize("document", ["README.md", "docs/CORRECTNESS.md", "docs/LEARNING.md", "docs/BENCHMARKS.md"])
def test_tests_and_scripts_named_exist(document: str) -> None:
    text = (ROOT / document).read_text()
    missing = []
    for path, name in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text):
        if not (ROOT / path).exists() or name and f"def {name}" not in (ROOT / path).read_text():
            missing.append(f"{path}::{name}" if name else path)
    assert not missing, missing


def test_backbone_examples_run_as_written(tmp_path, monkeypatch) -> None:
    blocks = _python_blocks("Backbones in your own project")
    assert len(blocks) == 1  # build and load, na2d, FasterRCNN
    monkeypatch.chdir(tmp_path)
    torch.save({"model": build_classifier("nat_tiny").state_dict()}, tmp_path / "nat_tiny.pth")
    namespace: dict = {
        "q": torch.randn(1, 9, 11, 2, 16),
        "k": torch.randn(1, 9, 11, 2, 16),
        "v": torch.randn(1, 9, 11, 2, 16),
    }
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    feats = namespace["feats"]
    assert [tuple(f.shape) for f in feats.values()] == [
        (2, 96, 128, 171),
        (2, 192, 64, 86),
        (2, 384, 32, 43),
        (2, 768, 16, 22),
    ]
    assert (namespace["backbone"].out_channels, namespace["backbone"].strides) == ([96, 192, 384, 768], [4, 8, 16, 32])
    assert not namespace["report"].missing_keys and not namespace["report"].unexpected_keys
    assert namespace["out"].shape == (1, 9, 11, 2, 16)
    assert namespace["model"].backbone.out_channels == 256


def _readme_tool_commands() -> list[tuple[str, list[str]]]:
    """Every ``tools/NAME.py ARGS`` command of the README's bash blocks (continued lines joined, comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            match = re.search(r"\btools/(\w+)\.py\b(.*)$", line)
            if match:
                commands.append((match[1], shlex.split(match[2].split(" #")[0])))
    return commands


def _tool_help(tool: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "argv", [f"tools/{tool}.py", "--help"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        runpy.run_path(str(ROOT / "tools" / f"{tool}.py"), run_name="__main__")
    return printed.getvalue()


def _config_options_parse(argv: list[str]) -> None:
    """``argv`` (``--config NAME`` and dotted options) through the training CLI's parser, nothing built or run."""
    from vision_tx.lightning.cli import train_main

    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as stopped:
        train_main([*argv, "--print_config"])
    assert stopped.value.code in (0, None), f"{shlex.join(argv)}: refused by the training CLI"


def test_every_tool_command_the_readme_shows_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command's own options are in its tool's ``--help``; its config options (``--config`` with the dotted
    ``--section.key`` ones, and every option of ``train.py``) pass the training CLI's parser: a renamed option fails."""
    commands = _readme_tool_commands()
    assert len(commands) > 20 and {tool for tool, _ in commands} >= {
        "train",
        "eval",
        "infer",
        "predict",
        "export",
        "attention",
    }
    helps: dict[str, str] = {}
    for tool, argv in commands:
        if tool == "train":
            _config_options_parse(argv)
            continue
        config = argv[argv.index("--config") : argv.index("--config") + 2] if "--config" in argv else []
        dotted = []  # each --section.key with its value
        for i, arg in enumerate(argv):
            flag = arg if arg.startswith("--") else argv[i - 1] if i else ""
            if flag.startswith("--") and "." in flag.split("=")[0]:
                dotted.append(arg)
        if config:
            _config_options_parse([*config, *dotted])
        own = {arg.split("=")[0] for arg in argv if arg.startswith("--") and "." not in arg.split("=")[0]}
        help_text = helps.setdefault(tool, _tool_help(tool, monkeypatch))
        unknown = sorted(option for option in own if not re.search(rf"{re.escape(option)}\b", help_text))
        assert not unknown, f"tools/{tool}.py {shlex.join(argv)}: {unknown} not in its --help"

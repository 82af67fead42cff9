"""Every ``lit-dof`` command documents every option of its own in ``--help``, with no Sphinx roles in the text, no
reStructuredText literals (double backticks), and descriptions and group titles that end as sentences do.

jsonargparse reads option help from the ``Args:`` sections of the classes and functions it builds a parser from,
so a missing or merged entry (``a, b: …``) or a ``:class:`` role shows up here as an option without help or with
markup. Options that Lightning or torch define (the trainer's, ``--optimizer``, ``--ckpt_path``, …) are theirs
to document and are left out.
"""

from __future__ import annotations

import re

import pytest

from lit_dof.commands import COMMANDS
from tests.conftest import REPO
from tests.pipeline.test_commands import QUICKSTART, _main

ROLES = re.compile(r":(class|func|meth|mod|data|attr|obj|paramref):`")
"""A Sphinx role, as it leaks into help text taken from a docstring."""

LIGHTNING_OPTIONS = ("--trainer", "--optimizer", "--lr_scheduler", "--ckpt_path", "--weights_only", "--seed_everything")
"""Options whose help comes from Lightning or torch (their own docstrings), not from lit-dof."""

MODELS = [
    "lit_dof.pipeline.layerwise.LayerwiseDistillation",
    "lit_dof.pipeline.direct.DirectDistillation",
    "lit_dof.pipeline.capture.TeacherCapture",
    "lit_dof.evaluation.finetune.TaskFinetuning",
]
DATA = ["lit_dof.data.datamodule.WikipediaDataModule", "lit_dof.evaluation.finetune_data.MultipleChoiceDataModule"]
FEATURE_MAPS = [
    "lit_dof.attention.LearnedPRF",
    "lit_dof.attention.PerformerFeatureMap",
    "lit_dof.attention.HedgehogFeatureMap",
    "lit_dof.attention.DiJiangFeatureMap",
]
PLANNERS = ["lit_dof.pipeline.planner.DoFPlanner", "lit_dof.pipeline.planner.FixedPlanner"]

HELPS = {
    **{command: [command, "--help"] for command in ("eval", "compare", "hybrid", "generate", "chat")},
    "fit": ["fit", "--config", QUICKSTART, "--help"],
    "validate": ["validate", "--config", QUICKSTART, "--help"],
    "predict": ["predict", "--help"],
    "plan": ["plan", "--config", QUICKSTART, "--help"],
    **{f"model={name.rsplit('.', 1)[1]}": ["fit", "--model.help", name] for name in MODELS},
    **{f"data={name.rsplit('.', 1)[1]}": ["fit", "--data.help", name] for name in DATA},
    **{
        f"feature_map={name.rsplit('.', 1)[1]}": ["fit", "--model", MODELS[0], "--model.feature_map.help", name]
        for name in FEATURE_MAPS
    },
    **{
        f"planner={name.rsplit('.', 1)[1]}": ["fit", "--model", MODELS[0], "--model.planner.help", name]
        for name in PLANNERS
    },
    "strategy": ["fit", "--trainer.strategy.help", "lit_dof.pipeline.strategies.ShardedDataParallelStrategy"],
}
"""Each help screen checked: the commands, and the classes a config names by ``class_path``."""

OURS_UNDER_TRAINER = ("--trainer.strategy.data_parallel_size", "--trainer.strategy.tensor_parallel_size")
"""The options under ``--trainer`` that lit-dof defines (ShardedDataParallelStrategy's own)."""


def option_helps(text: str) -> dict[str, str]:
    """``{option: its help}`` from an argparse help screen, jsonargparse's ``(type: …, default: …)`` tail removed.

    Args:
        text: the help screen.

    Returns:
        every option's first long name (``--model.lr_z``) and its help text, joined to one line.
    """
    helps: dict[str, str] = {}
    option = None
    for line in text.splitlines():
        header = re.match(r"^  (-[^ ]+(?: [^ ]+)*?)(?:  +(.*))?$", line)
        if header and line[2] == "-":
            names = [part.split()[0] for part in header.group(1).split(", ")]
            option = next((name for name in names if name.startswith("--")), names[0])
            helps[option] = header.group(2) or ""
        elif option is not None and line.startswith(" " * 8):
            helps[option] += " " + line.strip()
        else:
            option = None
    return {name: re.sub(r"\s*\(type: .*$", "", help_text).strip() for name, help_text in helps.items()}


MID_SENTENCE = re.compile(r"(?:[,;:(\-–—]|\b(?:a|an|and|as|at|by|for|from|in|is|its|of|on|or|the|to|with))$", re.I)
"""How a text cut mid-sentence ends: a comma, an opening parenthesis, an article, a preposition, …"""


def descriptions(text: str) -> list[str]:
    """A help screen's description, group titles (without argparse's colon) and epilog, each joined to one line:
    the blocks that start at the margin, up to their first indented line; the usage block excepted.

    Args:
        text: the help screen.

    Returns:
        the texts, in screen order.
    """
    found = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").splitlines()
        if not lines or lines[0].startswith(("usage:", " ")):
            continue
        head = []
        for line in lines:
            if line.startswith(" "):
                break
            head.append(line.strip())
        found.append(" ".join(head).removesuffix(":"))
    return found


def cut_mid_sentence(texts: list[str]) -> list[str]:
    """Those of ``texts`` that end mid-sentence (:data:`MID_SENTENCE`) or leave a parenthesis open."""
    return [text for text in texts if MID_SENTENCE.search(text) or text.count("(") != text.count(")")]


def test_cut_mid_sentence_finds_wrapped_summaries():
    text = (
        "usage: x [-h]\n          [--a A]\n\nRun the comparison. Progress goes to stderr: the cell under way (k of n),"
        "\n\noptions:\n  -h, --help  Show.\n\nWrite the report as dof.json and its figures (the:\n  --b B  b.\n\n"
        "A DataModule standardizes the splits. The main advantage is:\n  --c C  c.\n\nCustomize every aspect of "
        "training via flags:\n  --d D  d.\n\nwhere the examples sit: contexts (tokens;\nthose past it are dropped), "
        "depths:\n  --e E  e.\n"
    )
    found = descriptions(text)
    assert found[1:] == [
        "options",
        "Write the report as dof.json and its figures (the",
        "A DataModule standardizes the splits. The main advantage is",
        "Customize every aspect of training via flags",
        "where the examples sit: contexts (tokens; those past it are dropped), depths",
    ]
    assert cut_mid_sentence(found) == [found[0], found[2], found[3]]


def group_titles(text: str) -> list[str]:
    """The titles of an argparse help screen's groups (a class's first docstring line, for a class's group)."""
    return [line for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]


def lit_dof_help(capsys, monkeypatch, args: list[str]) -> str:
    """The help screen of ``lit-dof ARGS``, which must exit 0."""
    code, out, err = _main(capsys, monkeypatch, *args)
    assert code == 0, err
    return out


def undocumented(helps: dict[str, str]) -> tuple[list[str], list[str]]:
    """(options without help, options whose help holds a Sphinx role)."""
    missing = [name for name, text in helps.items() if not text]
    return missing, [name for name, text in helps.items() if ROLES.search(text)]


def test_option_helps_parses_argparse_layout():
    text = (
        "usage: x\n\noptions:\n  -h, --help            Show this help.\n  --a A                 first line\n"
        "                        second line (type: int, default: 1)\n  --b B\n"
        "                        (type: int, default: 2)\n  --c.help [CLASS]\n                        help of c.\n"
        "\nLinked arguments:\n  x --> y\n                        Use --y.help for details.\n"
    )
    assert option_helps(text) == {
        "--help": "Show this help.",
        "--a": "first line second line",
        "--b": "",
        "--c.help": "help of c.",
    }


@pytest.mark.parametrize("screen", list(HELPS))
def test_every_option_has_help_without_sphinx_roles(capsys, monkeypatch, screen):
    text = lit_dof_help(capsys, monkeypatch, HELPS[screen])
    helps = option_helps(text)
    ours = {
        name: help_text
        for name, help_text in helps.items()
        if not name.startswith(LIGHTNING_OPTIONS) or name in OURS_UNDER_TRAINER
    }
    assert ours, text
    missing, roles = undocumented(ours)
    assert not missing, f"options without help: {missing}"
    assert not roles, f"Sphinx roles in the help of {roles}"
    titles = [title for title in group_titles(text) if ROLES.search(title)]
    assert not titles, f"Sphinx roles in group titles: {titles}"
    assert "``" not in text
    assert not cut_mid_sentence(descriptions(text))
    if screen == "fit":  # the quickstart's own groups are all there
        assert {"--model", "--data", "--plan_files.figures", "--metrics_file.enabled"} <= set(helps)


OTHER_SCREENS = {
    "lit-dof": ["--help"],
    **{command: [command, "--help"] for command in COMMANDS if command not in HELPS},
    "fit --help-model": ["fit", "--help-model"],
    "fit --model.help by name": ["fit", "--model.help", "LayerwiseDistillation"],
}
"""The help screens :data:`HELPS` leaves out (its full option checks are for lit-dof's own options): the command
list, the commands whose options are Lightning's or lm-eval's, and the student's options by ``--help-model``."""


def test_every_command_has_a_help_screen_checked():
    assert {*HELPS, *OTHER_SCREENS} >= set(COMMANDS)
    assert all(text.endswith(".") and not cut_mid_sentence([text]) for text in COMMANDS.values()), COMMANDS


@pytest.mark.parametrize("screen", list(OTHER_SCREENS))
def test_descriptions_are_whole_sentences_without_markup(capsys, monkeypatch, screen):
    text = lit_dof_help(capsys, monkeypatch, OTHER_SCREENS[screen])
    found = descriptions(text)
    assert found and not cut_mid_sentence(found), found
    assert "``" not in text and not ROLES.search(text)
    if screen in COMMANDS and screen != "lm-eval":  # lm-eval's screen is lm-eval's own
        assert found[0].endswith("."), found[0]


def test_fit_help_opens_with_the_shortcut_to_the_students_options(capsys, monkeypatch):
    """``fit --help`` names ``--help-model`` in its first lines; ``--help-model`` prints the screen of
    ``--model.help`` for the configured model (LayerwiseDistillation without one)."""
    opening = "\n".join(lit_dof_help(capsys, monkeypatch, ["fit", "--help"]).splitlines()[:8])
    assert "lit-dof fit --help-model" in opening and "teacher, feature map, planner" in opening
    student = lit_dof_help(capsys, monkeypatch, ["fit", "--help-model"])
    assert "Help for --model.help=lit_dof.pipeline.layerwise.LayerwiseDistillation" in student
    options = option_helps(student)
    assert {
        "--model.teacher",
        "--model.feature_map",
        "--model.planner",
        "--model.sliding_window.window",
        "--model.lora",
        "--model.lr_z",
    } <= set(options)
    direct = lit_dof_help(
        capsys, monkeypatch, ["fit", "--config", str(REPO / "configs/methods/direct.yaml"), "--help-model"]
    )
    assert "Help for --model.help=lit_dof.pipeline.direct.DirectDistillation" in direct

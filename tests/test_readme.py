"""Every `dynrag ...` command in the README's code blocks parses with the real CLI (subcommands and flags as
documented), and the ones that need no index or model run."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"


def documented_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    lines = [re.split(r"\s#\s", line)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("dynrag ")]


def test_the_readme_documents_commands():
    assert len(documented_commands()) >= 10


@pytest.mark.parametrize("command", documented_commands())
def test_documented_command_parses(command):
    args = build_parser().parse_args(shlex.split(command)[1:])  # argparse exits (SystemExit) on a wrong flag
    assert callable(args.func)


@pytest.mark.parametrize("command", ["dynrag methods", "dynrag data", "dynrag models list"])
def test_documented_command_runs(command):
    assert command in documented_commands()
    out = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *shlex.split(command)[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=README.parent,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()


def _subcommands(parser, path=()):
    """(command path, parser) for every leaf subcommand of the CLI."""
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _subcommands(child, (*path, name))


# one spelling per kind of input across commands: dest -> the flag that sets it
CONSISTENT_FLAGS = {
    "index": "--index",
    "dataset": "--dataset",
    "dataset_format": "--dataset-format",
    "out": "--out",
    "limit": "--limit",
    "json": "--json",
}


def test_flags_are_spelled_alike_in_every_command():
    """An index, a dataset, its format, an output folder, a limit and JSON output are the same flag in every command
    that takes them (no positional index, no --format for a dataset's format)."""
    checked = 0
    for path, parser in _subcommands(build_parser()):
        for action in parser._actions:
            want = CONSISTENT_FLAGS.get(action.dest)
            if want is not None:
                assert want in action.option_strings, (
                    f"dynrag {' '.join(path)}: {action.dest} is {action.option_strings or 'positional'}, not {want}"
                )
                checked += 1
    assert checked > 30  # the walk reached the subcommands


def test_the_first_screen_holds_the_two_commands_the_demo_output_and_using_it():
    first = "\n".join(README.read_text(encoding="utf-8").splitlines()[:60])
    for must in ("make demo", "make test", "**What the demo prints.**", "## Using it", "stage times (s): setup"):
        assert must in first, must
    demo = re.search(r"```text\n(.*?)```", first, re.S)
    assert demo and re.search(r"^no-retrieval +\d\.\d{3}", demo.group(1), re.M) and "sr-rag" in demo.group(1)
    assert "dynrag index build" in first and "dynrag answer" in first  # the way to one's own data


def test_the_methods_table_has_one_row_a_method():
    from pipeline.methods.registry import all_methods

    text = README.read_text(encoding="utf-8")
    table = text[text.index("| method | family | paper | what it does |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert sorted(rows) == sorted(all_methods())  # each once

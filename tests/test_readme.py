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
    out = subprocess.run([sys.executable, "-m", "jobs.cli", *shlex.split(command)[1:]], capture_output=True, text=True,
                         timeout=120, cwd=README.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()

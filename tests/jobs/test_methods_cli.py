"""`dynrag methods`: one line a method grouped by family within a screen; NAME for parameters; --json for all."""

import json
import subprocess
import sys
from pathlib import Path

from jobs.methods import FAMILIES
from pipeline.methods.registry import all_methods

ROOT = Path(__file__).resolve().parents[2]


def dynrag(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_listing_fits_a_screen_with_one_line_a_method_under_its_family():
    lines = dynrag("methods").splitlines()
    assert len(lines) <= 40
    names = set(all_methods())
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}
    assert set(rows) == names and sum(line.startswith("  ") for line in lines) == len(names)  # once each
    assert set(FAMILIES) <= {line[:-1] for line in lines if line.endswith(":")}  # no method left under Other
    assert "Su et al. 2024" in rows["dragin"] and all_methods()["dragin"].description[:40] in rows["dragin"]
    heading = lines.index("DRAGIN and its baselines:")
    assert {lines[heading + i].split()[0] for i in range(1, 5)} == {"dragin", "flare", "fl-rag", "fs-rag"}


def test_a_named_method_shows_its_parameters_defaults_and_sources():
    out = dynrag("methods", "dragin")
    assert out.startswith("dragin (DRAGIN and its baselines): ") and "paper: DRAGIN (Su et al., ACL 2024)" in out
    assert "k  int = 3  documents per retrieval (Table 8: 3)" in out
    params = [p[0] for p in all_methods()["dragin"].defaults()]
    assert all(f"    {p}  " in out for p in params)


def test_json_holds_every_method_with_its_parameters():
    doc = json.loads(dynrag("methods", "--json"))
    assert [m["name"] for m in doc] == sorted(all_methods())
    by = {m["name"]: m for m in doc}
    assert by["sr-rag"]["family"] == "Baselines" and by["sr-rag"]["paper"].startswith("Lewis et al., 2020")
    assert {"name": "k", "type": "int", "default": 3, "source": "documents per retrieval (Table 8: 3)"} in by["dragin"][
        "params"
    ]

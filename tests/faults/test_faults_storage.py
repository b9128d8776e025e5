"""Storage faults through the real CLI: an output on a read-only filesystem, a disk that fills up
during a run (a small tmpfs in a user and mount namespace, `unshare -rm`), and a FAISS file damaged
without changing its size. Each is one `dynrag: error:` line with exit code 2; rows already written
stay, and no partial part file is left."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
from fault_tools import cli, damage_faiss_header, env_for, no_model_answer, one_error_line, run

pytestmark = pytest.mark.faults


def in_tmpfs(mount: str, options: str, cmd: list[str], after: str) -> subprocess.CompletedProcess:
    """`cmd` with a fresh tmpfs at `mount` (mount options `options`), then the shell line `after`."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode:
        pytest.skip("needs user and mount namespaces (unshare -rm)")
    script = f"mount -t tmpfs -o {options} tmpfs {mount} && {shlex.join(cmd)}; rc=$?; {after}; exit $rc"
    return run(["unshare", "-rm", "sh", "-c", script], env_for(), timeout=600)


def test_output_on_a_read_only_filesystem(nq_dev, tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    done = in_tmpfs(str(mnt), "ro", no_model_answer(nq_dev, f"{mnt}/out", 5), "true")
    assert done.returncode == 2
    assert "Read-only file system" in one_error_line(done.stderr)


def test_disk_full_during_a_run(nq_dev, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    # room for the batches a replica holds at once by default (21 parts of about 20 KB), not for all 120
    # (the batches committed before the disk filled stay committed, merged into parts/ by the rerun)
    listing = f"ls -a {mnt}/out/parts {mnt}/out/_committed"
    done = in_tmpfs(str(mnt), "size=640k", no_model_answer(nq_dev, f"{mnt}/out", 3000), listing)
    assert done.returncode == 2
    assert "No space left on device" in one_error_line(done.stderr)
    files = done.stdout.split()
    assert any(f.startswith("part-") for f in files), files  # the batches committed before stay
    assert not any(f.endswith(".tmp") for f in files), files


def test_faiss_file_damaged_at_the_same_size(capsys, data_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join((data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text().splitlines(True)[:20]))
    idx = tmp_path / "idx"
    assert run(cli("index", "build", str(corpus), "--index", str(idx))).returncode == 0
    damage_faiss_header(idx)
    done = run(
        cli("index", "search", "--index", str(idx), "--retriever", "dense", "--set", "index.verify=size", "a river")
    )
    assert done.returncode == 2
    assert f"cannot search {idx} (dense)" in one_error_line(done.stderr)

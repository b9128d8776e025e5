"""OrphanGuard (pipeline/backends/orphan_guard.py): processes it guards die when their owner is SIGKILLed, and
survive a normal `close()`. With a real vLLM engine: tests/faults/test_faults_orphans.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from fault_tools import ROOT, gone, wait_gone

OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from pipeline.backends.orphan_guard import OrphanGuard
    guard = OrphanGuard()
    child = subprocess.Popen(["sleep", "600"])
    if sys.argv[1] == "close":
        guard.close()
    print(child.pid, flush=True)
    time.sleep(600)
""")


def start_owner(mode: str) -> tuple[subprocess.Popen, int]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    return owner, int(owner.stdout.readline())


def test_the_guarded_child_dies_when_its_owner_is_killed():
    owner, child = start_owner("guard")
    try:
        assert not gone(child)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert wait_gone(child), "the child outlived its SIGKILLed owner"
    finally:
        owner.kill()
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_closed_guard_leaves_the_child_alone():
    owner, child = start_owner("close")
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        time.sleep(1.5)
        assert not gone(child)
    finally:
        owner.kill()
        if not gone(child):
            os.kill(child, signal.SIGKILL)

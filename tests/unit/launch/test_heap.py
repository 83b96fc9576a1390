"""``launch/heap.py``: the collector's thresholds while a command imports, and the freeze after.

Each case runs in a fresh interpreter: freezing is for the life of a process, and the pytest
process's own heap is settled by the conftest already.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)


def _run(body: str) -> str:
    code = "import gc, os, sys\nfrom hpcpipe.launch import heap\n" + textwrap.dedent(body)
    argv = [sys.executable, "-c", code]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_start_up_raises_gen0_and_settle_restores_the_defaults_and_freezes() -> None:
    out = _run(
        """
        defaults = gc.get_threshold()
        heap.start_up()
        assert gc.get_threshold() == (heap.STARTUP_THRESHOLD, *defaults[1:]), gc.get_threshold()
        assert gc.get_freeze_count() == 0
        import json, email.parser  # imports: objects that live on
        heap.settle()
        assert gc.get_threshold() == defaults, gc.get_threshold()
        frozen = gc.get_freeze_count()
        assert frozen > 10_000, frozen
        print("ok")
        """
    )
    assert out == "ok"


def test_a_second_settle_freezes_nothing_more_in_the_same_process() -> None:
    # A job's leftovers (cycles that are garbage by the next run_job) must stay collectable.
    out = _run(
        """
        heap.start_up()
        heap.settle()
        frozen = gc.get_freeze_count()
        class Node:
            pass
        leftovers = [Node() for _ in range(5000)]
        for node in leftovers:
            node.me = node  # a cycle each
        heap.start_up()
        heap.settle()
        assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
        del leftovers, node
        assert gc.collect() >= 5000  # the cycles were not frozen: collected
        print("ok")
        """
    )
    assert out == "ok"


def test_a_forked_child_settles_its_own_imports() -> None:
    out = _run(
        """
        heap.start_up()
        heap.settle()
        parent = gc.get_freeze_count()
        pid = os.fork()
        if pid == 0:
            import xml.dom.minidom, decimal  # the child's own imports
            heap.settle()
            os._exit(0 if gc.get_freeze_count() > parent else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        print("ok")
        """
    )
    assert out == "ok"


def test_importing_runs_without_the_collector_then_freezes_and_restores_it() -> None:
    out = _run(
        """
        heap.start_up()
        defaults = heap._DEFAULTS
        with heap.importing():
            assert not gc.isenabled()
            import json, email.parser
        assert gc.isenabled()
        assert gc.get_threshold() == defaults
        assert gc.get_freeze_count() > 10_000
        gc.disable()
        with heap.importing():  # a caller that had it off keeps it off
            import decimal
        assert not gc.isenabled()
        print("ok")
        """
    )
    assert out == "ok"


def test_a_program_that_never_started_up_keeps_its_collector() -> None:
    # A user's process that imports hpcpipe and calls run_job: nothing frozen, its thresholds kept.
    out = _run(
        """
        gc.set_threshold(5000, 20, 20)
        import json, email.parser
        heap.settle()
        assert gc.get_freeze_count() == 0, gc.get_freeze_count()
        assert gc.get_threshold() == (5000, 20, 20), gc.get_threshold()
        print("ok")
        """
    )
    assert out == "ok"

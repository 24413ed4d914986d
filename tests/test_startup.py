"""grpo_lab.startup: the collector paused by an entry point is running again once the job's model is loaded."""

from __future__ import annotations

import gc
import weakref

from grpo_lab import startup


class _Node:
    pass


def test_pause_then_resume_collects_and_freezes_what_start_up_made():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        startup.pause()
        assert not gc.isenabled()
        node = _Node()
        node.me = node  # start-up garbage: a reference cycle no one holds, which only the collector frees
        alive = weakref.ref(node)
        del node
        assert alive() is not None
        startup.resume()
        assert gc.isenabled()
        assert alive() is None  # freed by resume's full pass, not frozen with the rest
        assert gc.get_freeze_count() > frozen  # start-up objects moved out of the collector's way
    finally:
        gc.unfreeze()
        gc.enable()


def test_resume_without_pause_leaves_the_collector_alone():
    frozen = gc.get_freeze_count()
    startup.resume()
    assert gc.isenabled() and gc.get_freeze_count() == frozen

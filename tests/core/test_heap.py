"""``freeze_heap``: the rollout engine's first run freezes what is alive (once per process), a
config turns it off, and objects made afterwards are still collected."""

import subprocess
import sys
import textwrap


def test_the_first_run_freezes_the_heap_once_and_later_cycles_are_collected():
    script = textwrap.dedent(
        """
        import asyncio, gc, weakref
        from turngym.agents import RandomAgent
        from turngym.rollout import RolloutConfig, RolloutEngine

        def run(**cfg):
            engine = RolloutEngine("arith", RandomAgent(seed=0), RolloutConfig(max_turns=2, **cfg))
            trajs = asyncio.run(engine.run(2))
            assert len(trajs) == 2 and not any(t.masked for t in trajs)

        run(freeze_heap=False)
        assert gc.get_freeze_count() == 0, "freeze_heap=False froze"
        run()
        frozen = gc.get_freeze_count()
        assert frozen > 1000, frozen
        run()
        assert gc.get_freeze_count() == frozen, "a second run froze again"

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made after the freeze
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None, "a cycle made after the freeze was not collected"
        print("ok", frozen)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok ")

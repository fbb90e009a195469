"""turngym envs under Gymnasium's vector envs (docs/api.md, "Vectorisation").

Regression for issue 5: ``AsyncVectorEnv`` failed with gymnasium's generic message unless
``shared_memory=False``; the chat spaces now answer a request for shared memory with a turngym error that
says what to pass, and the documented ways of vectorising work.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import turngym
from turngym.core.spaces import SharedMemoryUnsupported
from turngym.core.types import Message


def make_arith():
    return turngym.make("arith", max_turns=3)


def test_shared_memory_is_refused_with_what_to_pass():
    with pytest.raises(SharedMemoryUnsupported, match=r"shared_memory=False") as err:
        AsyncVectorEnv([make_arith, make_arith])  # gymnasium's default is shared_memory=True
    assert 'vector_kwargs={"shared_memory": False}' in str(err.value)
    with pytest.raises(SharedMemoryUnsupported):
        gymnasium.make_vec("turngym/arith-v0", num_envs=2, vectorization_mode="async")


def check_vector(envs) -> None:
    try:
        obs, _ = envs.reset(seed=[0, 1])
        assert len(obs) == 2 and all(isinstance(m, Message) for o in obs for m in o)
        assert obs[0][1].content != obs[1][1].content  # two seeds, two tasks
        actions = [envs.single_action_space.sample(), "no call here"]
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        assert rewards.dtype == np.float64 and rewards.shape == (2,) and not terminated.any()
        assert infos["invalid_action"][1] and "no tool call" in obs[1][-1].content
    finally:
        envs.close()


def test_async_vector_env_without_shared_memory():
    check_vector(AsyncVectorEnv([make_arith, make_arith], shared_memory=False))


def test_make_vec_async_and_sync():
    check_vector(
        gymnasium.make_vec(
            "turngym/arith-v0",
            num_envs=2,
            vectorization_mode="async",
            vector_kwargs={"shared_memory": False},
            max_turns=3,
        )
    )
    check_vector(SyncVectorEnv([make_arith, make_arith]))

"""The agent factory: one typed spec per kind, a registry users extend, clear errors for bad specs,
and the backends it builds (the HF engines, around a held model object or from a path)."""

from contextlib import AsyncExitStack

import pytest
from pydantic import ValidationError

from turngym.agents import LLMAgent, RandomAgent, ScriptedAgent
from turngym.agents.factory import AgentSpec, agent_kind, agent_kinds, make_agent, make_token_backend
from turngym.agents.hf import HFBackend, HFSlotBackend


def test_bad_specs_are_clear_errors():
    with pytest.raises(ValidationError, match="unknown agent kind 'gpt'; registered: hf, hf_worker, openai"):
        AgentSpec(kind="gpt")
    with pytest.raises(ValidationError, match="agent kind 'vllm' needs a model"):
        AgentSpec(kind="vllm")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        AgentSpec(kind="scripted", url="http://x")  # a typo of urls
    with pytest.raises(ValidationError, match="must be >= 1"):
        AgentSpec(kind="hf", model="tiny", max_batch_size=0)
    assert {"scripted", "random", "openai", "hf", "hf_worker", "vllm"} <= set(agent_kinds())


async def test_agents_of_each_local_kind(tiny_dir):
    async with AsyncExitStack() as stack:
        assert isinstance(await make_agent(AgentSpec(kind="scripted"), stack), ScriptedAgent)
        assert isinstance(await make_agent(AgentSpec(kind="random", seed=3), stack), RandomAgent)
        spec = AgentSpec(kind="hf", model=str(tiny_dir), max_tokens=7, temperature=0.5, max_context=900)
        agent = await make_agent(spec, stack)
        assert isinstance(agent, LLMAgent) and type(agent.backend) is HFBackend  # CPU: continuous
        assert (
            agent.sampling.max_tokens == 7 and agent.sampling.temperature == 0.5 and agent.max_context == 900
        )
        slots = await make_agent(spec.model_copy(update={"hf_engine": "slots", "max_batch_size": 3}), stack)
        assert isinstance(slots.backend, HFSlotBackend)
        assert slots.backend.max_context == 900 and slots.backend.max_batch_size == 3
        gen = await slots.backend.generate([5, 6, 7], agent.sampling.replace(temperature=0.0))
        assert len(gen.token_ids) >= 1
        thread = slots.backend.scheduler_thread  # noqa: SLF001
    assert thread is not None and not thread.is_alive()  # the stack closed the backend


async def test_a_new_kind_is_one_registered_builder(monkeypatch):
    from turngym.agents import factory

    monkeypatch.setattr(factory, "_KINDS", dict(factory._KINDS))  # the registration ends with the test

    @agent_kind("always-scripted")
    async def build(spec, stack):
        return ScriptedAgent()

    async with AsyncExitStack() as stack:
        assert isinstance(await make_agent(AgentSpec(kind="always-scripted"), stack), ScriptedAgent)


def test_token_backends(tiny_dir, tokenizer):
    from turngym.agents.models import load_model

    model = load_model(tiny_dir)
    spec = AgentSpec(kind="hf", model=str(tiny_dir), hf_engine="slots", max_context=128, max_batch_size=2)
    held = make_token_backend(spec, model=model, tokenizer=tokenizer, max_wait_ms=50)
    assert isinstance(held, HFSlotBackend) and held.model is model and held.max_wait_s == 0.05
    with pytest.raises(ValueError, match="hf_worker loads the model in its worker"):
        make_token_backend(spec.model_copy(update={"kind": "hf_worker"}), model=model)
    with pytest.raises(ValueError, match="needs vllm urls"):
        make_token_backend(AgentSpec(kind="vllm", model="tiny"))
    with pytest.raises(ValueError, match="'random' has no token-level backend"):
        make_token_backend(AgentSpec(kind="random"))

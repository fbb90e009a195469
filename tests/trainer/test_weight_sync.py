"""Weight sync into a real vLLM server (CPU): LoRA adapters hot-loaded and full weights reloaded after
updates; one server (LoRA + weight reload enabled) serves every test of this module."""

import asyncio

import httpx
import pytest
import torch

from turngym.trainer.weight_sync import InProcessSync, VLLMFullSync, VLLMLoRASync, WeightSyncError

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPT = "<|im_start|>user\nEvaluate: (3 + 4)<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """The tiny model with an lm_head of its own (same values): vLLM's in-place reload cannot refresh a
    tied one, so full-weight sync refuses tied models."""
    from turngym.agents.models import load_model, load_tokenizer

    model = load_model("tiny", device="cpu")
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    path = tmp_path_factory.mktemp("untied")
    model.save_pretrained(path)
    load_tokenizer("tiny").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(untied):
    from turngym.agents.vllm import VLLMServer

    with VLLMServer(
        untied, max_model_len=1024, dtype="float32", enable_lora=True, max_lora_rank=8, weight_reload=True
    ) as s:
        yield s


def reload(url, path):
    from turngym.agents.vllm import VLLMBackend

    async def go():
        backend = VLLMBackend(url)
        try:
            await backend.reload_weights(path)
        finally:
            await backend.aclose()

    asyncio.run(go())


def served(url, prompt, adapter=None, max_tokens=8):
    """Greedy tokens and logprobs from the server."""
    from turngym.agents.backend import SamplingParams
    from turngym.agents.vllm import VLLMBackend

    async def go():
        backend = VLLMBackend(url)
        try:
            return await backend.generate(
                prompt, SamplingParams(max_tokens=max_tokens, temperature=0), adapter=adapter
            )
        finally:
            await backend.aclose()

    return asyncio.run(go())


def hf_logprobs(model, prompt, gen):
    from turngym.trainer.batching import token_logprobs

    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    return logp[0, len(prompt) :].tolist()


def test_in_process_sync_is_a_version_counter():
    sync = InProcessSync()
    assert sync(object(), 3) is None and sync.version == 3


def test_lora_sync_refuses_a_full_model():
    from turngym.agents.models import load_model

    with pytest.raises(WeightSyncError, match="peft"):
        VLLMLoRASync(["http://127.0.0.1:9"], "/tmp/x")(load_model("tiny", device="cpu"), 1)


def test_lora_adapters_hot_loaded_into_vllm_serve_the_trained_weights(tmp_path, server, untied):
    from peft import LoraConfig, get_peft_model

    from turngym.agents.models import load_model, load_tokenizer
    from turngym.agents.vllm import VLLMBackend

    tok = load_tokenizer("tiny")
    model = get_peft_model(
        load_model(untied, device="cpu"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    torch.manual_seed(0)
    with torch.no_grad():  # an "update": non-zero B matrices change the policy
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    prompt = tok.encode(PROMPT)
    sync = VLLMLoRASync([server.url], tmp_path / "adapters", keep=2)
    names = [sync(model, step) for step in (1, 2, 3)]
    assert names == ["policy-1", "policy-2", "policy-3"]

    async def models():
        backend = VLLMBackend(server.url)
        try:
            return await backend.models()
        finally:
            await backend.aclose()

    names_served = asyncio.run(models())
    gen, base = served(server.url, prompt, "policy-3"), served(server.url, prompt)
    assert "policy-3" in names_served and "policy-2" in names_served and "policy-1" not in names_served
    assert gen.logprobs == pytest.approx(hf_logprobs(model, prompt, gen), abs=2e-3)  # the trained adapter
    assert gen.token_ids != base.token_ids or gen.logprobs != pytest.approx(base.logprobs, abs=1e-3)


def test_full_weights_reloaded_into_vllm_serve_the_trained_model(tmp_path, server, untied):
    from turngym.agents.models import load_model, load_tokenizer

    tok = load_tokenizer("tiny")
    prompt = tok.encode(PROMPT)
    model = load_model(untied, device="cpu")
    before = served(server.url, prompt)
    assert before.logprobs == pytest.approx(hf_logprobs(model, prompt, before), abs=2e-3)
    torch.manual_seed(1)
    with torch.no_grad():  # an "update" of every weight
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sync = VLLMFullSync([server.url], tmp_path / "weights", keep=1)
    try:
        sync(model, 1)
        after = served(server.url, prompt)
        assert after.logprobs == pytest.approx(hf_logprobs(model, prompt, after), abs=2e-3)  # the new weights
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
        sync(model, 2)
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["step-000002"]  # keep=1, no partials
    finally:  # the module's server goes back to the base model
        reload(server.url, untied)
    again = served(server.url, prompt)
    assert again.token_ids == before.token_ids and again.logprobs == pytest.approx(before.logprobs, abs=1e-4)


def test_trainer_with_full_weight_sync_rolls_out_the_updated_policy_through_vllm(tmp_path, server, untied):
    """The trainer pushes its warm-started weights, rolls out through the vLLM server, updates, and
    pushes the weights back: after the run the server generates exactly what the saved final model
    computes."""
    from turngym.agents.models import load_model, load_tokenizer
    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer
    from turngym.trainer.metrics import read_metrics

    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "steps=2",
            f"model.path={untied}",
            "weight_sync=vllm_full",
            f"rollout.backend.urls=[{server.url}]",
            "rollout.env=arith",
            "rollout.env_kwargs={depth: 1, max_turns: 2}",
            "rollout.tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens=12",
            "rollout.max_context=1024",
            "optim.lr=1e-2",
            "sft.steps=3",  # a warm start changes the weights for sure; it is pushed before the first rollout
            "sft.tasks=4",
            "sft.batch_size=2",
            "sft.lr=1e-2",
            "log.progress=false",
        ],
    )
    try:
        Trainer(cfg).train()
        rows = read_metrics(tmp_path / "run")
        assert [r["step"] for r in rows if "time/sync" in r] == [1, 2]
        assert all(r["rollout/generated_tokens"] > 0 for r in rows if "time/sync" in r)
        assert (tmp_path / "run" / "weights" / "step-000002").is_dir()
        tok = load_tokenizer("tiny")
        prompt = tok.encode(PROMPT)
        final = load_model(tmp_path / "run" / "final", device="cpu")
        gen = served(server.url, prompt)
        assert gen.logprobs == pytest.approx(hf_logprobs(final, prompt, gen), abs=2e-3)
        base = load_model(untied, device="cpu")
        assert gen.logprobs != pytest.approx(hf_logprobs(base, prompt, gen), abs=1e-3)  # it did train
    finally:
        reload(server.url, untied)


def test_full_weight_reload_on_a_server_without_dev_mode_says_how_to_enable_it():
    from turngym.agents.backend import BackendError
    from turngym.agents.vllm import VLLMBackend

    def handler(request):
        return httpx.Response(404, json={"detail": "Not Found"})

    async def go():
        backend = VLLMBackend("http://vllm.invalid:8000", max_retries=0)
        backend._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            await backend.reload_weights("/tmp/weights")
        finally:
            await backend.aclose()

    with pytest.raises(BackendError, match="VLLM_SERVER_DEV_MODE=1"):
        asyncio.run(go())


def test_full_sync_refuses_peft_and_tied_models_and_config_checks_it(tmp_path):
    from peft import LoraConfig, get_peft_model

    from turngym.agents.models import load_model
    from turngym.trainer.config import load_config

    lora = get_peft_model(load_model("tiny", device="cpu"), LoraConfig(r=2, target_modules="all-linear"))
    with pytest.raises(WeightSyncError, match="vllm_lora"):
        VLLMFullSync(["http://127.0.0.1:9"], tmp_path)(lora, 1)
    with pytest.raises(WeightSyncError, match="untied lm_head"):
        VLLMFullSync(["http://127.0.0.1:9"], tmp_path)(load_model("tiny", device="cpu"), 1)
    assert not list(tmp_path.iterdir())  # refused before writing anything
    with pytest.raises(ValueError, match="vllm_full needs"):
        load_config(None, ["weight_sync=vllm_full"])

"""The learner's memory knobs on CPU: the output head's log-prob kernels (the switch-off path is the
unfused one, liger's fused kernel equals it through Triton's interpreter), the FSDP full copy freed
for the update and rebuilt by the refresh, torchao's quantized AdamW state (its measured bytes per
parameter and its steps against torch's AdamW), and out-of-memory errors that name their knobs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from turngym.trainer.batching import token_logprobs
from turngym.trainer.config import load_config
from turngym.trainer.oom import TrainerOutOfMemory

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


@pytest.fixture(scope="module")
def tiny_model(tiny_dir):
    from turngym.agents.models import load_model

    return load_model(tiny_dir, device="cpu")


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 900, (3, 29), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 20:] = 0
    return ids, attn


def test_logprob_kernel_off_is_the_unfused_path_and_liger_on_cpu_is_the_chunked_one(tiny_model):
    ids, attn = _batch()
    with torch.no_grad():
        logits = tiny_model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        off, _ = token_logprobs(tiny_model, ids, attn, kernel="torch")
        chunked, _ = token_logprobs(tiny_model, ids, attn, chunk_tokens=8, kernel="torch")
        fallback, _ = token_logprobs(tiny_model, ids, attn, chunk_tokens=8, kernel="liger")
    assert (off[:, 0] == 0).all()
    torch.testing.assert_close(off[:, 1:], expected, rtol=0, atol=0)  # switch off: unchanged
    torch.testing.assert_close(chunked, off, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fallback, chunked, rtol=0, atol=0)  # CPU: liger falls back to torch's


LIGER_SCRIPT = """
import os, sys, torch
sys.path.insert(0, {root!r})
from turngym.agents.models import load_model
from turngym.trainer.batching import _chunked_logprobs, _output_head, token_logprobs
model = load_model({tiny!r}, device="cpu")
g = torch.Generator().manual_seed(0)
ids = torch.randint(3, 900, (2, 13), generator=g)
attn = torch.ones_like(ids)
weights = torch.rand(ids.shape, generator=g)
out = []
for fused in (False, True):
    model.zero_grad(set_to_none=True)
    if fused:
        logp = _chunked_logprobs(model, _output_head(model), ids, attn, False, 10_000, fused=True)[0]
    else:
        logp = token_logprobs(model, ids, attn)[0]
    (logp * weights).sum().backward()
    out.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
(a, ga), (b, gb) = out
torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
for x, y in zip(ga, gb, strict=True):
    torch.testing.assert_close(y, x, rtol=1e-3, atol=1e-5)
print("max diff", float((b - a).abs().max()))
"""


@pytest.mark.slow
def test_liger_fused_logprobs_equal_torch_with_gradients_in_the_triton_interpreter(tiny_dir):
    """liger-kernel's fused linear + cross-entropy, run on CPU by Triton's interpreter: the picked
    log-probs and every parameter's gradient equal the unfused path's."""
    pytest.importorskip("liger_kernel")
    script = LIGER_SCRIPT.format(root=str(ROOT), tiny=str(tiny_dir))
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "max diff" in proc.stdout


def test_release_frees_the_full_copy_and_the_refresh_rebuilds_it(tiny_model):
    import copy

    from turngym.trainer.fsdp import FullWeights

    model = copy.deepcopy(tiny_model)
    full = FullWeights(model, torch.float32)
    trainable = [p for p in full.module.parameters() if p.requires_grad]
    expected = sum(p.numel() * p.element_size() for p in trainable)
    assert full.release() == expected > 0
    assert all(p.untyped_storage().nbytes() == 0 for p in trainable)
    with torch.no_grad():  # the "update": new values in the trained model
        for p in model.parameters():
            p.add_(0.5)
    full.refresh(model)
    assert not full.released
    for (name, p), q in zip(model.named_parameters(), full.module.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)


def test_release_full_copy_is_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="needs cluster.strategy=fsdp"):
        load_config(None, ["cluster.fsdp.release_full_copy=true"])
    with pytest.raises(ValueError, match="rollout.keep_backend keeps an engine whose CUDA graphs"):
        load_config(
            None,
            ["cluster.strategy=fsdp", "cluster.fsdp.release_full_copy=true", "rollout.keep_backend=true"],
        )
    with pytest.raises(ValueError, match="optimizer"):
        load_config(None, ["optim.optimizer=adam_2bit"])
    with pytest.raises(ValueError, match="logprob_kernel"):
        load_config(None, ["optim.logprob_kernel=cce"])


def test_state_bytes_per_param_are_computed_from_the_formats():
    from turngym.trainer.optimizers import state_bytes_per_param, static_bytes_per_param

    assert state_bytes_per_param("adamw", "float32") == 8.0
    assert state_bytes_per_param("adamw", "bfloat16") == 4.0
    assert state_bytes_per_param("adamw_8bit", "float32") == pytest.approx(2 * (1 + 4 / 256))
    assert state_bytes_per_param("adamw_4bit", "float32") == pytest.approx(2 * (0.5 + 4 / 128))
    # per rank under FSDP on 2 GPUs: fp32 master + fp32 grads + state, halved, plus the bf16 full copy
    assert static_bytes_per_param(2)["total"] == (4 + 4 + 8) / 2 + 2
    small = static_bytes_per_param(4, "adamw_8bit", release_full_copy=True)
    state = 2 * (1 + 4 / 256)
    assert small["update"] == pytest.approx((4 + 4 + state) / 4)  # no copy during the update
    assert small["refresh"] == pytest.approx((4 + state) / 4 + 2)  # the copy back, the gradients freed
    assert small["total"] == small["refresh"]
    # several micro-batches without a reduce-scatter between them: FSDP2's whole-model fp32 gradient
    assert static_bytes_per_param(4, accumulate_unsharded=True)["unsharded_grads"] == 4
    assert static_bytes_per_param(1, "adamw", "bfloat16", sharded=False)["total"] == 2 + 2 + 4


def _state_bytes(state: dict) -> int:
    total = 0
    for key in ("exp_avg", "exp_avg_sq"):
        t = state[key]
        parts = [t.codes, t.scale] if hasattr(t, "codes") else [t]
        total += sum(x.numel() * x.element_size() for x in parts)
    return total


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw_8bit", "adamw_4bit"])
def test_quantized_adamw_state_is_as_small_as_computed_and_steps_like_adamw(name):
    """torchao's AdamW on a 64x256 weight: the state's measured bytes equal ``state_bytes_per_param``
    (the fixed quantization map aside), and three steps move the weights as torch's AdamW does."""
    from turngym.trainer.optimizers import make_optimizer, state_bytes_per_param

    optim = load_config(None, [f"optim.optimizer={name}", "optim.lr=1e-2"]).optim
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 256))
    ref = torch.nn.Parameter(w.detach().clone())
    start = w.detach().clone()
    opt, ref_opt = (
        make_optimizer([w], optim),
        make_optimizer([ref], load_config(None, ["optim.lr=1e-2"]).optim),
    )
    x = torch.randn(32, 256)
    for _ in range(3):
        for o, p in ((opt, w), (ref_opt, ref)):
            o.zero_grad()
            (x @ p.T).tanh().pow(2).sum().backward()
            o.step()
    state = opt.state[w]
    assert type(state["exp_avg"]).__name__.startswith("OptimState")
    assert _state_bytes(state) == pytest.approx(w.numel() * state_bytes_per_param(name, "float32"))
    assert _state_bytes(ref_opt.state[ref]) == w.numel() * state_bytes_per_param("adamw", "float32")
    step, ref_step = (w.detach() - start).flatten(), (ref.detach() - start).flatten()
    assert ref_step.abs().max() > 1e-2  # the steps did move the weights
    cos = torch.nn.functional.cosine_similarity(step, ref_step, dim=0)
    assert cos > 0.95, float(cos)


def _trainer(tmp_path):
    from turngym.trainer.loop import Trainer

    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            "rollout.env=arith",
            "rollout.env_kwargs={depth: 1, max_turns: 1}",
            "rollout.tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens=6",
            "log.progress=false",
            "log.tensorboard=false",
        ],
    )
    trainer = Trainer(cfg)
    trainer.setup()
    return trainer


def _raise_oom(*_):
    raise torch.OutOfMemoryError(SIMULATED)


def test_an_oom_in_the_update_names_its_knobs_and_stays_an_oom(tmp_path):
    from turngym.trainer.update import policy_update

    trainer = _trainer(tmp_path)
    trajs, credit, _ = trainer.orchestrator.collect(0)
    assert any(not t.masked for t in trajs)
    hook = trainer.policy.model.register_forward_hook(_raise_oom)  # the OOM where the update's forward runs
    try:
        with pytest.raises(torch.OutOfMemoryError) as info:
            policy_update(trainer.policy, trainer.cfg, trajs, credit.token_advantages)
    finally:
        hook.remove()
    err = info.value
    assert isinstance(err, TrainerOutOfMemory) and err.phase == "update"
    text = str(err)
    assert text.startswith("out of device memory during the update: CUDA out of memory")
    assert "optim.micro_batch_tokens = 8192" in text and "padded tokens" in text
    assert "model.gradient_checkpointing = False" in text and "cluster.strategy = ddp" in text
    assert err.memory == {}  # CPU: no allocator numbers to report


def test_an_oom_in_the_rollout_engine_stops_the_step_with_its_knobs(tmp_path):
    """The engine masks the rows of a pass that ran out of memory; the step stops and says so."""
    trainer = _trainer(tmp_path)
    hook = trainer.policy.full_model.register_forward_hook(_raise_oom)
    try:
        with pytest.raises(TrainerOutOfMemory) as info:
            trainer.train_step()
    finally:
        hook.remove()
    err = info.value
    assert err.phase == "rollout" and isinstance(err, torch.OutOfMemoryError)
    text = str(err)
    assert "4/4 trajectories masked by it; first: BackendError: OutOfMemoryError: CUDA out of memory" in text
    assert "rollout.backend.max_batch_size = 64" in text and "rollout.max_context = 1536" in text
    assert trainer.run.step == 0  # nothing was trained on the surviving rows


def test_a_full_checkpoint_of_quantized_adamw_state_loads_with_weights_only(tmp_path):
    """torch.load(weights_only=True) refuses unknown tensor subclasses: torchao's state classes are
    allowed, so a DDP/one-process run with adamw_8bit resumes its optimizer."""
    from torchao.optim.subclass_8bit import OptimState8bit

    from turngym.trainer.checkpoint import load_weights, save_weights

    state = OptimState8bit.zeros((4, 256), signed=True, block_size=256)
    state.codes.random_(0, 255, generator=torch.Generator().manual_seed(0))
    state.scale.fill_(0.5)
    save_weights(tmp_path / "optim.pt", {"state": {0: {"exp_avg": state}}})
    loaded = load_weights(tmp_path / "optim.pt")["state"][0]["exp_avg"]
    assert type(loaded) is OptimState8bit
    torch.testing.assert_close(loaded.dequantize(), state.dequantize(), rtol=0, atol=0)


def test_a_sharded_quantized_state_refuses_another_world_size_and_says_why(tmp_path):
    import json

    from turngym.trainer.optimizers import make_optimizer
    from turngym.trainer.sharded_checkpoint import FORMAT, load_sharded

    ckpt = tmp_path / "step-000001"
    (ckpt / "dcp").mkdir(parents=True)  # refused before any shard is read
    (ckpt / "state.json").write_text(json.dumps({"step": 1, "format": FORMAT, "world_size": 2}))
    model = torch.nn.Linear(256, 64)
    optim = load_config(None, ["optim.optimizer=adamw_8bit"]).optim
    opt = make_optimizer(list(model.parameters()), optim)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(ValueError, match=r"written by 2 ranks with a quantized optimizer state .* has 1"):
        load_sharded(ckpt, model, opt, sched)

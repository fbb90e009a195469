"""YAML configs, dotted overrides, validation, and the shipped example configs."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from turngym.trainer.config import TrainConfig, apply_overrides, load_config

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "configs").glob("*.yaml"))


def test_defaults_are_a_valid_run():
    cfg = TrainConfig()
    assert cfg.credit.method == "grpo" and cfg.loss.clip_low == 0.2 and cfg.loss.clip_high == 0.28
    assert cfg.loss.kl_coef == 0.0 and cfg.loss.entropy_coef == 0.0


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 3\ncredit:\n  method: igpo\n  igpo:\n    norm: separate\n")
    cfg = load_config(
        p,
        [
            "optim.lr=2e-6",
            "credit.igpo.ig_type=log_prob_diff",
            "rollout.env_kwargs={depth: 2}",
            "model.lora={r: 4}",
        ],
    )
    assert cfg.steps == 3 and cfg.credit.method == "igpo" and cfg.credit.igpo.norm == "separate"
    assert cfg.optim.lr == 2e-6 and cfg.credit.igpo.ig_type == "log_prob_diff"
    assert cfg.rollout.env_kwargs == {"depth": 2} and cfg.model.lora.r == 4


def test_bad_configs_are_clear_errors(tmp_path):
    with pytest.raises(ValidationError):
        load_config(None, ["credit.method=ppo"])
    with pytest.raises(ValidationError):
        load_config(None, ["optim.lrr=1"])  # typo: unknown field
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides({}, ["steps"])
    with pytest.raises(ValueError, match="not a section"):
        apply_overrides({"steps": 3}, ["steps.x=1"])
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(p)
    with pytest.raises(ValidationError, match="vllm_lora"):
        load_config(None, ["weight_sync=vllm_lora"])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_configs_load(path):
    cfg = load_config(path)
    assert cfg.steps > 0


def test_the_rollout_backend_is_one_agent_spec_and_weight_sync_only_moves_weights():
    # the default: the policy served in process, with the rollout's context settings
    spec = load_config(None, ["rollout.backend={max_batch_size: 8, hf_engine: continuous}"]).backend_spec()
    assert (spec.kind, spec.model, spec.max_batch_size, spec.hf_engine) == ("hf", "tiny", 8, "continuous")
    # rollout.backend overrides the defaults in AgentSpec's own keys
    spec = load_config(
        None, ["rollout.backend={hf_engine: slots, max_batch_size: 4, dtype: bfloat16}"]
    ).backend_spec()
    assert (spec.hf_engine, spec.max_batch_size, spec.dtype) == ("slots", 4, "bfloat16")
    # vLLM servers named in the backend are where weights go
    cfg = load_config(
        None,
        ["weight_sync=vllm_lora", "model.lora={r: 4}", "rollout.backend={kind: vllm, urls: [http://a:8000]}"],
    )
    assert cfg.vllm_urls == ["http://a:8000"] and cfg.backend_spec().urls == ["http://a:8000"]
    assert cfg.backend_spec().kind == "vllm" and cfg.backend_spec().model == "tiny"
    # a kind the weights cannot reach, an unknown kind, a second model, disagreeing URLs: clear errors
    with pytest.raises(ValidationError, match="cannot receive weight_sync='in_process'"):
        load_config(None, ["rollout.backend={kind: vllm, urls: [http://a:8000]}"])
    with pytest.raises(ValidationError, match="unknown agent kind 'nope'"):
        load_config(None, ["rollout.backend={kind: nope}"])
    with pytest.raises(ValidationError, match="must be model.path"):
        load_config(None, ["rollout.backend={model: other}"])
    with pytest.raises(ValidationError, match="disagree"):
        load_config(
            None,
            [
                "weight_sync=vllm_lora",
                "model.lora={r: 4}",
                "vllm_urls=[http://a:8000]",  # a deprecated alias of rollout.backend.urls
                "rollout.backend={kind: vllm, urls: [http://b:8000]}",
            ],
        )


def test_flat_backend_keys_and_url_keys_are_deprecated_aliases_of_rollout_backend():
    """rollout.backend is the one home of backend settings; the keys of earlier releases still load,
    moved in there with a FutureWarning that names the new key, and a disagreement is an error."""
    with pytest.warns(FutureWarning, match="rollout.hf_engine is deprecated: set rollout.backend.hf_engine"):
        cfg = load_config(None, ["rollout.max_batch_size=8", "rollout.hf_engine=continuous"])
    assert cfg.rollout.backend == {"max_batch_size": 8, "hf_engine": "continuous"}
    assert (cfg.backend_spec().max_batch_size, cfg.backend_spec().hf_engine) == (8, "continuous")
    with pytest.warns(FutureWarning, match="cluster.vllm_urls is deprecated"):
        cfg = load_config(
            None, ["weight_sync=vllm_lora", "model.lora={r: 4}", "cluster.vllm_urls=[http://a:8000]"]
        )
    assert cfg.backend_spec().urls == ["http://a:8000"] == cfg.vllm_urls
    with pytest.raises(ValidationError, match="rollout.hf_engine and rollout.backend.hf_engine disagree"):
        load_config(None, ["rollout.hf_engine=slots", "rollout.backend={hf_engine: continuous}"])
    assert "hf_engine" not in type(cfg.rollout).model_fields  # one home: no flat field left

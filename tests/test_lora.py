"""trainer.lora: validation, the engine's LoRA API on bad input, and one short LoRA run end to end (adapter-only
weight sync, adapter checkpoints and their resume, final/ in peft's format, final-merged/ for transformers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import invoke_cli
from tests.helpers.train_e2e import metrics, run_train


def _validate(*overrides: str) -> tuple[int, str]:
    out = invoke_cli("config", "validate", *overrides)
    return out.returncode, out.stdout + out.stderr


def test_lora_config_errors_are_reported_together_with_a_did_you_mean():
    code, text = _validate("trainer.lora.rank=8", "trainer.lora.alpha=0", "trainer.lora.target_modules=[q_prj]",
                           "trainer=megatron", "trainer.weight_sync=nccl")
    assert code == 2, text
    assert "trainer.lora.alpha: must be > 0" in text
    assert "did you mean 'q_proj'?" in text
    assert "trainer=megatron has no LoRA" in text
    assert "trainer.weight_sync: with trainer.lora" in text
    assert "Traceback" not in text
    code, text = _validate("trainer.lora.rank=-1")
    assert code == 2 and "trainer.lora.rank: must be >= 0" in text
    code, text = _validate("trainer.lora.rnk=8")
    assert code == 2 and "did you mean 'trainer.lora.rank'?" in text
    assert _validate("trainer.lora.rank=8")[0] == 0


def test_preflight_checks_target_modules_against_any_model_path(tiny, tmp_path):
    """A model.path of an architecture no preset names (GPT-NeoX): pre-flight builds it on the meta device and
    refuses what is not one of its linear layers, each with the reason, a did-you-mean or the list; exit 2."""
    from transformers import AutoModelForCausalLM, GPTNeoXConfig

    model = tmp_path / "neox"
    AutoModelForCausalLM.from_config(GPTNeoXConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32)).save_pretrained(model)
    args = (f"model.path={model}", f"model.tokenizer_path={tiny}", "trainer.lora.rank=8")
    code, text = _validate(*args, "trainer.lora.target_modules=[query_key_valu,embed_in,attention.dense]")
    assert code == 2 and "Traceback" not in text, text
    assert "did you mean 'query_key_value'?" in text
    assert "is not a linear layer in the model at" in text and "(its class: Embedding)" in text
    assert "attention.dense" not in text  # a dotted suffix of a linear layer, as peft matches it
    code, text = _validate(*args)  # the default targets are the Llama family's projections: one error says so
    assert code == 2 and "trainer.lora.target_modules: unset, so the defaults (q_proj" in text, text
    assert "set trainer.lora.target_modules to some of dense, dense_4h_to_h, dense_h_to_4h, lm_head, " \
        "query_key_value" in text
    assert _validate(*args, "trainer.lora.target_modules=[query_key_value,dense]")[0] == 0


def test_sglang_engines_are_launched_with_lora_flags(tiny):
    from slimecli.config.compose import load
    from slimecli.launch.plan import engine_specs

    cfg = load(["rollout=sglang", "trainer.lora.rank=16", "trainer.lora.target_modules=[q_proj,v_proj]",
                f"model.path={tiny}", "rollout.port=30000"])
    argv = engine_specs(cfg, "config.yaml")[0].argv
    i = argv.index("--enable-lora")
    assert argv[i:i + 8] == ["--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "q_proj", "v_proj",
                             "--max-loras-per-batch", "2"]


def test_engine_lora_api_refuses_bad_requests_with_4xx(engine, tmp_path):
    assert engine.post("/load_lora_adapter", {"lora_path": str(tmp_path)}).status_code == 400  # no name
    resp = engine.post("/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert resp.status_code == 400 and resp.json()["success"] is False and "not a peft adapter" in resp.text
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 0, "lora_alpha": 8}))
    torch.save({}, tmp_path / "x.pt")
    from safetensors.torch import save_file

    save_file({"base_model.model.model.layers.0.mlp.nope.lora_A.weight": torch.zeros(2, 2)},
              str(tmp_path / "adapter_model.safetensors"))
    resp = engine.post("/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert resp.status_code == 400 and "r must be a positive integer" in resp.json()["error_message"]
    resp = engine.post("/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert resp.status_code == 400 and resp.json()["success"] is False
    assert engine.post("/update_weight_version", {}).status_code == 400
    assert engine.post("/load_lora_adapter", {"lora_name": "x", "lora_path": 3, "bogus": 1}).status_code == 400


def test_engine_lora_bodies_are_decoded_with_errors_naming_each_field(engine):
    """The adapter endpoints' bodies go through the one request decoder: every problem at once, by field."""
    def error(path: str, body: dict) -> str:
        resp = engine.post(path, body)
        assert resp.status_code == 400, resp.text
        return resp.json()["error"]["message"]

    text = error("/load_lora_adapter", {"lora_nme": "x", "lora_path": 3, "pinned": "yes"})
    assert "lora_nme: unknown key" in text and "did you mean 'lora_name'?" in text
    assert "lora_path: expected str (got 3)" in text and "pinned: expected bool" in text
    assert "lora_name: is required" in text
    assert "lora_name: must not be empty" in error("/load_lora_adapter", {"lora_name": ""})
    assert "lora_name: longer than 256 characters" in error("/load_lora_adapter", {"lora_name": "n" * 300, "lora_path": "/x"})
    assert "lora_name: expected str (got 5)" in error("/unload_lora_adapter", {"lora_name": 5})
    assert "new_version: is required" in error("/update_weight_version", {"abort_all_requests": False})
    text = error("/update_weight_version", {"new_version": True, "abort_all_requests": 1})
    assert "new_version: expected str | int" in text and "abort_all_requests: expected bool" in text


def _trainer_logits(run: Path, step_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    """The logits of the trainer's own model: peft around the base, the checkpoint's adapter loaded the way a resume
    loads it."""
    from transformers import AutoModelForCausalLM

    from slimecli.config.io import load_frozen
    from slimecli.train.lora import model_keys, wrap
    from slimecli.train.policy import load_full_state_dict

    cfg = load_frozen(run / "config.yaml")
    model = wrap(AutoModelForCausalLM.from_pretrained(cfg.model.resolved_path, dtype=torch.float32), cfg)
    load_full_state_dict(model, model_keys(load_file(str(step_dir / "model.safetensors"))), strict=False)
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


# what differs between two runs of the same config: wall-clock times and rates
_TIMING = ("time", "time/", "perf/", "rollout/time_s", "rollout/tokens_per_s")


def _comparable(run: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(_TIMING)} for row in metrics(run)]


@pytest.mark.slow
def test_lora_run_syncs_adapters_checkpoints_resumes_exactly_and_exports(tmp_path):
    """A LoRA run (rank 4, KL loss against the adapters-off base) of 2 steps, and a copy of its directory as it
    stood after step 1 resumed by the same command: the same step-2 metrics and adapter (each sample's own seed
    gives the resumed run's fresh engine the same draws); the engine merges each pushed adapter, checkpoints hold
    adapters and their Adam state, and final/ and final-merged/ load in peft and transformers with the trainer's
    logits."""
    whole, run = tmp_path / "whole", tmp_path / "run"
    args = ["trainer.nproc=1", "trainer.lora.rank=4", "trainer.kl_loss_coef=0.01", "eval.at_start=false",
            "eval.at_end=false", "rollout.batch_size=2", "trainer.global_batch_size=16", "trainer.micro_batch_size=16",
            "trainer.save_interval=1", "trainer.max_steps=2"]
    out = run_train(whole, *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the run as a stop after step 1 leaves it: without what step 2 and the end wrote
    shutil.copytree(whole, run, ignore=shutil.ignore_patterns(".lock", "logs", "step_2", "v2", "final*"))
    out = run_train(run, *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints' / 'step_1'} at step 1" in (run / "logs" / "trainer.log").read_text()
    resumed, straight = _comparable(run), _comparable(whole)
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == [1, 2]
    for a, b in zip(resumed, straight, strict=True):
        assert a.keys() == b.keys()
        for key in a:  # the draws are the same; log-probs of other engine batches differ in rounding only
            exact = key.startswith(("reward/", "rollout/")) or key in ("step", "weight_version")
            assert a[key] == (b[key] if exact else pytest.approx(b[key], rel=1e-4, abs=1e-6)), key
    adapter, straight_adapter = (load_file(str(r / "checkpoints" / "step_2" / "model.safetensors")) for r in (run, whole))
    assert adapter.keys() == straight_adapter.keys()
    assert all(torch.allclose(adapter[k], straight_adapter[k], atol=1e-5) for k in adapter)

    engine_log = (whole / "logs" / "engine-0.log").read_text()
    for v in (1, 2):
        assert f"LoRA adapter policy-v{v} merged" in engine_log
    assert "LoRA adapter policy-v2 merged" in (run / "logs" / "engine-0.log").read_text()
    pushed = run / "weights" / "v2"
    assert sorted(p.name for p in pushed.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]

    step = run / "checkpoints" / "step_2"
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    moments = torch.load(step / "optimizer.pt", weights_only=True)["state"]
    assert len(moments) == len(adapter)  # Adam state for the adapters, nothing for the frozen base
    assert {tuple(s["exp_avg"].shape) for s in moments.values()} <= {tuple(t.shape) for t in adapter.values()}

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 42, 7, 300, 11, 2]])
    expected = _trainer_logits(run, step, ids)
    base = json.loads((run / "final" / "adapter_config.json").read_text())["base_model_name_or_path"]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                           str(run / "final"))
    merged = AutoModelForCausalLM.from_pretrained(str(run / "final-merged"), dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(peft_model.eval()(input_ids=ids).logits, expected, atol=1e-4)
        assert torch.allclose(merged.eval()(input_ids=ids).logits, expected, atol=1e-4)
        untrained = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()(input_ids=ids).logits
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the adapter changed the policy

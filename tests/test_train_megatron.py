"""trainer=megatron against trainer=torch on one fixed batch: same log-probs, update metrics and weights.

megatron-core runs on CPU over gloo (slimecli.train.megatron.cpu). The model is the tiny Qwen3 with its
vocabulary cut to 4093 rows, so tensor parallelism has to pad the vocabulary (to 4094) and mask the padding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from slimecli.launch.ranks import MEGATRON_PRELOAD
from tests.helpers import run_ranks
from tests.helpers.megatron_check import LR, check_cfg, fixed_batch, run

pytestmark = pytest.mark.slow  # every test here starts real processes

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 4093
ATOL = 1e-4


@pytest.fixture(scope="module")
def odd_vocab_model(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a vocabulary that no TP size above 1 divides (tied embeddings, cut to VOCAB rows)."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("odd") / "m"
    out.mkdir()
    for f in tiny.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((tiny / "config.json").read_text())
    config["vocab_size"] = VOCAB
    (out / "config.json").write_text(json.dumps(config))
    state = load_file(tiny / "model.safetensors")
    cut = ("model.embed_tokens.weight", "lm_head.weight")
    state = {k: v[:VOCAB].contiguous() if k in cut else v for k, v in state.items()}
    save_file(state, out / "model.safetensors")
    return out


def megatron_result(model: Path, out: Path, tp: int, pp: int, optimizer: str = "adam",
                    sequence_parallel: bool = False, dp: int = 1, export: bool = False) -> dict[str, Any]:
    run_ranks("megatron_check", tp * pp * dp, str(out), str(model), str(tp), str(pp), optimizer,
           *(["sp"] if sequence_parallel else []), *(["export"] if export else []), preload=MEGATRON_PRELOAD)
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def torch_result(odd_vocab_model: Path) -> dict[str, Any]:
    return run(check_cfg(str(odd_vocab_model), name="torch"), fixed_batch(VOCAB))


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for a, b in zip(got["logp"], want["logp"], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=ATOL, rtol=0)
    for key in ("train/pg_loss", "train/grad_norm", "train/lr", "train/updates"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], abs=ATOL), key
    assert set(got["state"]) == set(want["state"])
    for name, value in want["state"].items():
        assert_updated_alike(name, torch.tensor(got["state"][name]), torch.tensor(value))


def assert_updated_alike(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """The weights after the updates: within ATOL, but for at most one element in a thousand, which may be off by up
    to one step (LR). Adam divides each gradient by its own running magnitude, so where a weight's gradient is near
    zero and changes sign between updates, the rounding of the two back-ends' kernels (which differs by CPU) moves
    it by a visible part of a step; a wrong layout or a missed gradient moves most elements by about a step."""
    diff = (got - want).abs()
    far = int((diff > ATOL).sum())
    assert far <= max(1, diff.numel() // 1000), f"{name}: {far} of {diff.numel()} elements differ by more than {ATOL}"
    assert float(diff.max()) <= LR, f"{name}: off by {float(diff.max())}, more than one step ({LR})"


def test_the_converted_model_scores_and_updates_like_the_hf_model(odd_vocab_model, torch_result, tmp_path):
    assert_same(megatron_result(odd_vocab_model, tmp_path, tp=1, pp=1), torch_result)


def assert_export_is_per_tensor(export: dict[str, Any]) -> None:
    """The weight export sends tensor by tensor: the same weights as the whole-stage gather it replaced, with
    its largest message one parameter, where the whole-stage object was far larger (a stage: here half the
    model or all of it)."""
    assert export["names"] == export["old_names"] and "model.layers.1.mlp.down_proj.weight" in export["names"]
    assert export["equal_old"]
    assert export["largest_message"] <= export["largest_parameter"] < export["old_largest_message"]
    assert export["old_largest_message"] > export["total"] / 4


def test_tensor_parallel_2_matches_the_torch_trainer(odd_vocab_model, torch_result, tmp_path):
    """TP=2 pads the vocabulary to 4094; log-probs, the clipped gradient norm and the updated weights agree;
    the export all-gathers one parameter at a time."""
    result = megatron_result(odd_vocab_model, tmp_path, tp=2, pp=1, export=True)
    assert_same(result, torch_result)  # the exported weights: the torch trainer's
    assert_export_is_per_tensor(result["export"])


def test_sequence_parallel_matches_the_torch_trainer(odd_vocab_model, torch_result, tmp_path):
    """TP=2 with the sequence split too (inputs padded to even lengths, norm gradients all-reduced over TP)."""
    result = megatron_result(odd_vocab_model, tmp_path, tp=2, pp=1, sequence_parallel=True)
    assert result["sequence_parallel"] is True
    assert_same(result, torch_result)


def test_pipeline_parallel_2_matches_the_torch_trainer(odd_vocab_model, torch_result, tmp_path):
    """PP=2 through megatron-core's 1F1B schedule; the tied embedding lives on both stages and stays tied; the
    export sends the second stage's parameters to rank 0 one at a time."""
    result = megatron_result(odd_vocab_model, tmp_path, tp=1, pp=2, export=True)
    assert_same(result, torch_result)
    assert_export_is_per_tensor(result["export"])


def test_data_parallel_2_matches_the_torch_trainer(odd_vocab_model, torch_result, tmp_path):
    """Two replicas (TP=1, DP=2): each scores and trains on its half of the batch; megatron-core's DDP sums
    what the stages weighed over the whole batch, so the update equals one process's. The replicas share out
    the optimizer's main weights and moments (megatron-core's distributed optimizer)."""
    result = megatron_result(odd_vocab_model, tmp_path, tp=1, pp=1, dp=2)
    assert result["distributed_optimizer"] is True
    assert_same(result, torch_result)


def test_sharded_checkpoint_resumes_at_another_tp_and_at_dp2(odd_vocab_model, tmp_path):
    """megatron-core's distributed checkpoint (weights and Adam moments, each rank its shards): saved after one
    update at TP=2 and resumed at TP=1; saved at DP=2 (the distributed optimizer: each replica holds half of the
    moments) and resumed at DP=2. The next update equals an uninterrupted run's (two updates at DP=2, saving
    between them). A DP=2 checkpoint cannot resume at DP=1 (megatron-core stores the two optimizers' states in
    different shapes): refused with a message that says so. Tolerance: layouts sum in different orders (~1e-6
    apart after one update), which Adam's normalisation can lift to ~1e-4 on elements with tiny second moments;
    a wrong reshard, lost moments or a wrong Adam step move weights by a quarter of lr (1e-2) or more."""
    from slimecli.train.megatron.dist_checkpoint import check_optimizer_kind

    run, model = "megatron_resume_check", str(odd_vocab_model)
    dp_dir, tp_dir = tmp_path / "dp", tmp_path / "tp"
    run_ranks(run, 2, "save-straight", str(dp_dir), model, "1", preload=MEGATRON_PRELOAD)  # TP=1 on 2 ranks: DP=2
    run_ranks(run, 2, "resume", str(dp_dir), model, "1", preload=MEGATRON_PRELOAD)
    run_ranks(run, 2, "save", str(tp_dir), model, "2", preload=MEGATRON_PRELOAD)
    run_ranks(run, 1, "resume", str(tp_dir), model, "1", preload=MEGATRON_PRELOAD)
    straight = json.loads((dp_dir / "straight-1x2.json").read_text())
    for resumed_at in (dp_dir / "resume-1x2.json", tp_dir / "resume-1.json"):
        resumed = json.loads(resumed_at.read_text())
        assert set(resumed) == set(straight)
        for name, value in straight.items():
            torch.testing.assert_close(torch.tensor(resumed[name]), torch.tensor(value), atol=1e-3, rtol=0,
                                       msg=lambda m, name=name, at=resumed_at.name: f"{at}, {name}: {m}")
    with pytest.raises(ValueError, match=r"distributed optimizer \(data parallel > 1\).*plain optimizer"):
        check_optimizer_kind(dp_dir / "sharded", distributed=False)
    check_optimizer_kind(tp_dir / "sharded", distributed=False)

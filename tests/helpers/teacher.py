"""Shared by the teacher tests: tiny HF checkpoints made with transformers, and a real server under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from slimecli.process import kill_group
from tests.helpers import ROOT, free_port, wait_dead

VOCAB = 1001  # odd: does not divide by tp=2, so the last shard is padded


def make_checkpoint(path: Path, seed: int, vocab: int = VOCAB, loud_token: int | None = None) -> Path:
    """`loud_token`: that token's output row becomes 1e29 x e_0, so its logit is ~1e29 (the final norm keeps
    |h_0| <= sqrt(32)): finite, and under the ranks' 1e30 bound on logit / temperature at temperature 1 but not
    at 0.01. Only the TP rank whose vocabulary slice holds the token sees it: a real rank-local failure."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg)
    if loud_token is not None:
        with torch.no_grad():
            row = model.lm_head.weight[loud_token]
            row.zero_()
            row[0] = 1e29
    model.save_pretrained(str(path))
    return path


def reference_log_probs(path: Path, ids: list[int], temperature: float = 1.0):
    """[len-1, V] log-softmax of a plain full-vocabulary forward (tests only)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits / temperature, dim=-1)


class Server:
    """`slimecli teacher serve ...` started as a user would; stopped by killing its process group."""

    def __init__(self, tmp: Path, overrides: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log_path = tmp / f"teacher-{self.port}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "slimecli", "teacher", "serve", f"teacher.port={self.port}",
                f"run.dir={tmp / f'run-{self.port}'}", *overrides]
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"teacher exited with {self.proc.returncode}:\n{self.read_log()[-4000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"teacher not ready after {timeout}s:\n{self.read_log()[-4000:]}")

    def read_log(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            kill_group(self.proc.pid, grace_s=20, leader=self.proc)  # torchrun and its ranks
            self.proc.wait(10)
        self.log.close()
        wait_dead([self.proc.pid], 5)


def biased_teacher(student: Path, path: Path, prefers, margin: float = 2.0, seed: int = 1) -> Path:
    """A teacher with the student's tokenizer and vocabulary whose every next-token distribution leans the same
    way: a one-layer Phi model (its output layer has a bias) whose bias is +margin on the token ids where
    ``prefers(id)`` holds and -margin elsewhere, its weights small. A tiny student learns such a preference
    within a few dozen OPD steps; a sharpened random model's, tied to each context, takes thousands."""
    import json
    import shutil

    import torch
    from transformers import PhiConfig, PhiForCausalLM

    vocab = json.loads((student / "config.json").read_text())["vocab_size"]
    torch.manual_seed(seed)
    model = PhiForCausalLM(PhiConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, max_position_embeddings=4096))
    with torch.no_grad():
        model.lm_head.weight.mul_(0.1)
        model.lm_head.bias.copy_(torch.tensor([margin if prefers(i) else -margin for i in range(vocab)]))
    model.save_pretrained(str(path))
    for f in student.iterdir():  # the student's tokenizer
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "added_tokens")):
            shutil.copy(f, path / f.name)
    return path

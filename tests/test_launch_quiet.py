"""Library noise stays out of the console (and in the logs); --verbose shows it. Sample lines are copied from
torch 2.x's torchrun and transformers' weight loading."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

from slimecli.launch import quiet
from slimecli.launch.quiet import LIBRARY_WARNING, ConsoleFilter, noise
from slimecli.launch.spec import ProcessSpec
from slimecli.launch.supervisor import Supervisor

PREFIX = "W1205 13:46:33.491000 5891 torch/distributed/run.py:874] "
OMP_BANNER = [
    PREFIX,
    PREFIX + "*****************************************",
    PREFIX + "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system "
             "being overloaded, please further tune the variable for optimal performance in your application as "
             "needed. ",
    PREFIX + "*****************************************",
]
LOADING = ("\rLoading weights:   0%|          | 0/24 [00:00<?, ?it/s]\rLoading weights: 100%|██████████| 24/24 "
           "[00:00<00:00, 5552.00it/s]")
SHARDS = "[rank0]:Loading checkpoint shards: 100%|██████████| 2/2 [00:01<00:00,  1.52it/s]"
EMPTY = "an empty line (or the empty first line of a multi-line log message)"
PEFT = ("/venv/lib/python3.11/site-packages/peft/tuners/tuners_utils.py:196: UserWarning: Model with "
        "`tie_word_embeddings=True` and the tied_target_modules=['lm_head'] are part of the adapter.")
TRANSFORMERS = ("[rank1]:/venv/lib/python3.11/site-packages/transformers/modeling_utils.py:2145: FutureWarning: "
                "`is_gradient_checkpointing` is deprecated")
OWN_WARNING = f"{Path(quiet.__file__).parent.parent / 'train' / 'loop.py'}:10: UserWarning: slimecli says this"
KEPT = [
    "train step 1/6 [3s, ETA 16s] step reward 0.011 | reward (last 10) 0.011",
    "2026-12-05 13:47:49,792 slimecli.train INFO saved checkpoint step_1",
    "Traceback (most recent call last):",
    "E1205 13:46:33.491000 5891 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
    "local_rank: 0 (pid: 5898)",
    "Loading the dataset from data.jsonl",  # not a progress bar
    OWN_WARNING,  # slimecli's own warnings are the user's business
    "  indented, but no warning before it",
]


NOISE_LINES = [
    (OMP_BANNER[0], EMPTY),
    ("", EMPTY),  # an empty line a program printed: an empty `trainer |` line on the console tells nothing
    ("   ", EMPTY),
    (OMP_BANNER[1], "a banner's rule of asterisks"),
    (OMP_BANNER[2], "torchrun OMP_NUM_THREADS banner"),
    (OMP_BANNER[3], "a banner's rule of asterisks"),
    (LOADING, "a model-loading progress bar"),
    (SHARDS, "a model-loading progress bar"),
    (PEFT, LIBRARY_WARNING),
    (TRANSFORMERS, LIBRARY_WARNING),
]


@pytest.mark.parametrize("line,kind", NOISE_LINES)
def test_library_noise_is_recognised(line, kind):
    assert noise(line) == kind  # as what it is: a pattern too broad for its kind matches the wrong lines


@pytest.mark.parametrize("line", KEPT)
def test_what_a_user_needs_is_kept(line):
    assert noise(line) is None


def run_worker(tmp_path: Path, verbose: bool) -> tuple[str, str]:
    lines = [*OMP_BANNER, LOADING, "", PEFT, "  warnings.warn(", "step 1 done"]
    code = f"import sys\nfor line in {lines!r}:\n    print(line, flush=True)\n"
    out = io.StringIO()
    console = Console(file=out, highlight=False, soft_wrap=True, width=400)
    sup = Supervisor([ProcessSpec(name="trainer", argv=[sys.executable, "-c", code], kind="worker")],
                     tmp_path / "logs", console=console, grace_s=2, verbose=verbose)
    assert sup.run() == 0
    return out.getvalue(), (tmp_path / "logs" / "trainer.log").read_text(encoding="utf-8")


def test_the_console_leaves_the_noise_to_the_log(tmp_path):
    console, log = run_worker(tmp_path, verbose=False)
    assert "trainer | step 1 done" in console
    assert "OMP_NUM_THREADS" not in console and "*****" not in console and "Loading weights" not in console
    assert "Warning" not in console and "warnings.warn" not in console and "UserWarning" in log
    assert all(line.split("|", 1)[1].strip() for line in console.splitlines() if "|" in line)  # no empty lines
    assert "Setting OMP_NUM_THREADS" in log and "Loading weights: 100%" in log and "step 1 done" in log


def test_verbose_shows_every_line(tmp_path):
    console, _ = run_worker(tmp_path, verbose=True)
    assert "Setting OMP_NUM_THREADS" in console and "Loading weights: 100%" in console and "step 1 done" in console


def test_a_library_warnings_source_line_goes_with_it():
    lines = [PEFT, "  warnings.warn(", "train step 1/2 [1s] step reward 0.1", "  an indented line of slimecli's",
             OWN_WARNING, "  warnings.warn(OWN)"]
    console = ConsoleFilter()
    assert [console.noise(line) for line in lines] == [LIBRARY_WARNING, LIBRARY_WARNING, None, None, None, None]


def test_workers_print_a_warning_on_one_line(capsys):
    import warnings

    from slimecli.observe.worker import one_line_warning

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = one_line_warning
        warnings.warn_explicit("two\nlines", FutureWarning, "/x/site-packages/transformers/m.py", 7)
    line = capsys.readouterr().err
    assert line == "/x/site-packages/transformers/m.py:7: FutureWarning: two lines\n" and noise(line) == LIBRARY_WARNING

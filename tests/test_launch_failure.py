"""A failed child reaches the user as one clear last line: which process, why, where its log is; never only
torchrun's own traceback and banner."""

from __future__ import annotations

import io
import sys
import textwrap

from rich.console import Console

from slimecli.launch.failure import reason
from slimecli.launch.spec import ProcessSpec
from slimecli.launch.supervisor import Supervisor

PY = sys.executable

# The shape torchrun prints when one rank raises (recorded from torch 2.x, paths shortened).
TORCHRUN_TAIL = """\
rank 0 starting
Traceback (most recent call last):
  File "/x/worker.py", line 5, in <module>
    raise ValueError("torchrun started 2 ranks but teacher.tp x teacher.dp = 1 x 1")
ValueError: torchrun started 2 ranks but teacher.tp x teacher.dp = 1 x 1
W1204 03:03:18.942000 22136 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 22276 closing signal SIGTERM
E1204 03:03:18.946000 22136 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 22277) of binary: python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/x/worker.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_03:03:18
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 22277)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()


def test_the_reason_is_the_workers_exception_and_the_root_cause_rank():
    assert reason(TORCHRUN_TAIL) == "rank 1: ValueError: torchrun started 2 ranks but teacher.tp x teacher.dp = 1 x 1"


def test_a_worker_that_prints_its_error_and_exits_is_quoted():
    assert TORCHRUN_TAIL[5].startswith("W1204")  # torchrun's report starts here
    lines = ["INFO starting", "trainer: EngineError: engine-0 at 127.0.0.1:1 went away", *TORCHRUN_TAIL[5:]]
    assert reason(lines) == "rank 1: trainer: EngineError: engine-0 at 127.0.0.1:1 went away"


def test_a_rank_killed_by_a_signal_is_said_so_not_its_last_log_line():
    lines = ["2026-12-04 03:10:02,347 teacher[0] INFO generate id=5 tokens=24",
             *TORCHRUN_TAIL[5:]]
    lines = [line.replace("exitcode  : 1 (pid: 22277)", "exitcode  : -9 (pid: 22277)  (SIGKILL)") for line in lines]
    assert reason(lines) == "rank 1 was killed by SIGKILL"
    assert reason(["2026-12-04 03:10:02,347 x INFO only logging"]) == ""


def test_prefixed_rank_lines_and_servers_without_torchrun():
    assert reason(["[rank3]: Traceback (most recent call last):", '[rank3]:   File "x", line 1',
                   "[rank3]: RuntimeError: NCCL error"]) == "rank 3: RuntimeError: NCCL error"
    assert reason(["Uvicorn running", "OSError: [Errno 98] address already in use"]) == \
        "OSError: [Errno 98] address already in use"
    assert reason([]) == ""


def run_plan(tmp_path, argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    console = Console(file=out, highlight=False, soft_wrap=True, width=300)
    code = Supervisor([ProcessSpec(name="trainer", argv=argv, kind="worker")], tmp_path / "logs",
                      console=console, grace_s=3).run()
    return code, out.getvalue()


def test_a_rank_that_raises_under_torchrun_ends_in_one_clear_line(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import os, time
        if os.environ["RANK"] == "1":
            raise ValueError("torchrun started 2 ranks but teacher.tp x teacher.dp = 1 x 1")
        time.sleep(60)
    """))
    code, output = run_plan(tmp_path, [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(worker)])
    last = output.rstrip().splitlines()[-1]
    assert code == 1
    assert last == ("trainer failed: rank 1: ValueError: torchrun started 2 ranks but teacher.tp x teacher.dp = 1 x 1 "
                    f"(exit code 1; full log: {tmp_path / 'logs' / 'trainer.log'})"), output[-2000:]


def test_the_real_trainer_entry_with_an_unreadable_config(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_bytes(b"trainer: [1, 2\n")
    code, output = run_plan(tmp_path, [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                       "-m", "slimecli.train", "--config", str(config)])
    last = output.rstrip().splitlines()[-1]
    assert code == 1 and last.startswith("trainer failed: rank ") and f"{config}: cannot read the run config" in last, output[-2000:]
    assert last.endswith(f"full log: {tmp_path / 'logs' / 'trainer.log'})")

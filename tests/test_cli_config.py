"""The CLI as a user runs it: exit codes, messages, no traceback, no torch import on light paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from slimecli.launch.ranks import MEGATRON_PRELOAD
from tests.helpers import ROOT, invoke_cli, run_cli


def test_help_lists_every_command_with_examples():
    for argv in (["--help"], ["-h"]):
        out = invoke_cli(*argv)
        assert out.returncode == 0
        for command in ("train", "config", "plan", "recipes"):
            assert command in out.stdout
        assert "slimecli train +recipe=opd" in out.stdout


def test_python_dash_m_and_console_script_agree():
    script = Path(sys.executable).parent / "slimecli"
    assert script.exists(), "the console script is installed with the package"
    script_help = subprocess.run([str(script), "--help"], capture_output=True, text=True).stdout
    module_help = run_cli("--help").stdout
    assert " ".join(script_help.split()).replace("Usage: slimecli", "Usage: python -m slimecli") == \
        " ".join(module_help.split())


def test_recipes_list_show_copy(tmp_path):
    out = invoke_cli("recipes", "list", env={"COLUMNS": "80"})
    assert out.returncode == 0
    names = [line.split()[0] for line in out.stdout.splitlines() if not line.startswith(" ")]
    assert {"quickstart", "opd", "swe_agent"} <= set(names)
    assert all(len(line.split(maxsplit=1)) == 2 for line in out.stdout.splitlines()
               if not line.startswith(" "))  # each has a description
    assert all(len(line) <= 80 for line in out.stdout.splitlines())  # wrapped to the terminal
    # the whole first paragraph of the recipe's comment, not its first line: unwrapped, it is the file's text
    listed = " ".join(out.stdout.split())
    assert "the hidden tests grade it, and GRPO learns to choose the fix. The resolved rate starts near 1/3." in listed
    shown = invoke_cli("recipes", "show", "swe_agent")
    assert shown.stdout.startswith("# @package _global_")
    copied = invoke_cli("recipes", "copy", "swe_agent", str(tmp_path / "my.yaml"))
    assert copied.returncode == 0 and (tmp_path / "my.yaml").read_text() == shown.stdout
    assert invoke_cli("recipes", "copy", "swe_agent", str(tmp_path / "my.yaml")).returncode == 2  # no silent overwrite
    again = invoke_cli("config", "show", f"+recipe={tmp_path / 'my.yaml'}")
    assert again.returncode == 0 and yaml.safe_load(again.stdout)["recipe"] == "my"
    by_dir = invoke_cli("config", "validate", "--recipe-dir", str(tmp_path), "+recipe=my")
    assert by_dir.returncode == 0, by_dir.stderr


def test_config_show_is_fully_resolved_yaml():
    out = invoke_cli("config", "show", "+recipe=swe_agent", "agent=codex", "optimizer=stateless_adam", "optimizer.lr=2e-6")
    assert out.returncode == 0, out.stderr
    data = yaml.safe_load(out.stdout)
    assert data["agent"]["name"] == "codex" and data["optimizer"]["lr"] == 2e-6
    assert data["optimizer"]["betas"] == [0.9, 0.999]  # defaults are shown too
    assert "hydra" not in data


def test_validate_ok_and_errors_exit_2_without_traceback():
    ok = invoke_cli("config", "validate", "+recipe=opd", "teacher.url=http://127.0.0.1:7999")
    assert ok.returncode == 0 and ok.stdout.startswith("OK: recipe=opd") and len(ok.stdout.splitlines()) == 1
    bad = invoke_cli("config", "validate", "optimizer=stateless_adam", "optimizer.amsgrad=true", "optimizer.lrr=1")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr + bad.stdout
    assert "optimizer.amsgrad" in bad.stderr and "did you mean 'optimizer.lr'" in bad.stderr


def test_train_with_bad_config_launches_nothing(tmp_path):
    out = invoke_cli("train", "trainer.max_steps=-1", f"run.root={tmp_path}")
    assert out.returncode == 2 and "trainer.max_steps: must be > 0" in out.stderr
    assert not any(tmp_path.iterdir())


def test_stray_option_is_an_error():
    out = invoke_cli("config", "show", "--optimzer=adam")
    assert out.returncode == 2 and "unknown option" in out.stderr


def test_plan_json_lists_processes_in_start_order(tmp_path, tiny):
    out = invoke_cli("plan", "+recipe=opd", f"model.path={tiny}", f"teacher.model_path={tiny}", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert [p["name"] for p in plan] == ["engine-0", "teacher", "trainer"]
    trainer = plan[-1]
    assert trainer["argv"][1:5] == ["-m", "slimecli.launch.ranks", "--nproc", "2"]  # one node: no torchrun
    # one rank on one node (the teacher here, trainer.nproc=1 below) starts without torchrun's agent: rank 0 of a
    # world of one, its store on a free port
    assert plan[1]["argv"][1:3] == ["-m", "slimecli.teacher"]
    assert plan[1]["env"]["WORLD_SIZE"] == "1" and plan[1]["env"]["MASTER_PORT"] == "0"
    single = json.loads(invoke_cli("plan", f"model.path={tiny}", "trainer.nproc=1", "--json").stdout)[-1]
    assert single["argv"][1:3] == ["-m", "slimecli.train"] and single["env"]["RANK"] == "0"
    assert trainer["argv"][-2] == "--config" and trainer["argv"][-1].endswith("config.yaml")
    # a megatron-core trainer's ranks are forked once it is imported (launch/ranks.py: MEGATRON_PRELOAD)
    megatron = json.loads(invoke_cli("plan", f"model.path={tiny}", "trainer=megatron", "--json").stdout)[-1]
    assert megatron["argv"][5:9] == ["--preload", ",".join(MEGATRON_PRELOAD), "-m", "slimecli.train"]
    (engine_port,) = plan[0]["ports"]  # rollout.port=auto: a free port, picked for the plan
    assert plan[0]["probe"]["url"].endswith(f":{engine_port}/health_generate")
    # a teacher whose tokenizer is not the student's: refused by plan as by train
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    bad = invoke_cli("plan", "+recipe=opd", f"model.path={tiny}", f"teacher.model_path={tmp_path}", "--json")
    assert bad.returncode == 2 and "teacher.model_path: cannot compare the tokenizers" in bad.stderr, bad.stderr
    assert plan[1]["probe"]["url"] == f"http://127.0.0.1:{plan[1]['ports'][0]}/healthz"
    human = invoke_cli("plan", "+recipe=swe_agent")  # pre-flight passes: the CLI is installed, the sandbox starts
    assert human.returncode == 0 and "command:" in human.stdout and "ready:" in human.stdout


def test_multinode_plan_uses_master_address(tmp_path):
    out = invoke_cli("plan", "cluster.nnodes=2", "cluster.node_rank=1", "cluster.master_addr=10.0.0.1",
                  "cluster.master_port=29600", f"run.dir={tmp_path}", "--json")
    plan = json.loads(out.stdout)
    assert [p["name"] for p in plan] == ["trainer"]  # engines run once, on node 0
    argv = plan[-1]["argv"]
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.1" and argv[argv.index("--master-port") + 1] == "29600"
    unshared = invoke_cli("plan", "cluster.nnodes=2")
    assert unshared.returncode == 2 and "run.dir: a multi-node run needs run.dir" in unshared.stderr


def test_light_commands_never_import_torch():
    code = (
        "import sys\n"
        "from slimecli.cli.app import app\n"
        "for argv in (['--help'], ['config', 'show', '+recipe=swe_agent'], ['config', 'validate'], ['plan'],\n"
        "             ['recipes', 'list']):\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, (argv, e.code)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('NO_TORCH')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "NO_TORCH" in out.stdout, out.stderr


def test_machine_checks_refuse_a_megatron_layout_the_model_cannot_take(tmp_path):
    """The tiny model has 4 heads, 2 KV heads and 2 layers: TP=4 and PP=3 cannot split it; bf16 needs a GPU."""
    out = invoke_cli("train", "trainer=megatron", "trainer.tensor_parallel_size=4", "trainer.pipeline_parallel_size=3",
                  "trainer.nproc=12", "model.dtype=bfloat16", f"run.root={tmp_path}")
    assert out.returncode == 2, out.stderr
    assert "trainer.tensor_parallel_size: the model's num_key_value_heads=2 does not split into 4" in out.stderr
    assert "trainer.pipeline_parallel_size: the model's num_hidden_layers=2 does not split into 3" in out.stderr
    assert "model.dtype: megatron-core's mixed-precision optimizer needs a GPU" in out.stderr
    assert "Traceback" not in out.stderr


def test_validate_plan_and_train_refuse_an_agent_run_alike(tmp_path):
    """What `train` refuses before it starts, `config validate` and `plan` refuse too, with the same message."""
    args = ["+recipe=swe_agent", f"agent.binary={tmp_path / 'claude'}", "agent.max_context_len=4096",
            f"run.root={tmp_path / 'runs'}"]
    outs = [invoke_cli(*cmd, *args) for cmd in (["config", "validate"], ["plan"], ["train"])]
    for out in outs:
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "agent.binary=" in out.stderr and "slimecli agent install claude_code" in out.stderr
        assert "agent.max_context_len: the claude_code CLI's own prompt takes at least" in out.stderr
    assert outs[0].stderr == outs[1].stderr == outs[2].stderr
    assert not (tmp_path / "runs").exists()  # nothing was started or written



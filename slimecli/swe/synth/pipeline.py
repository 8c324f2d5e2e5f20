"""The whole synthesis run: SRC -> the suite at base -> candidate bugs in a seeded order -> kept, checked tasks.

Deterministic for a seed: the candidates are enumerated in file order, shuffled by the seed (functions first,
then each function's edits, one of each kind before a second of any), and tried in windows of that order by
`--jobs` workers at once; results are taken in the order, never in the order they finish. A kept bug becomes a
row only when `tasks check` passes it (the same checks, in the same grading sandboxes, as the command), so
every row written is a valid task.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.config.groups.task import TaskConfig
from slimecli.swe.grade import is_protected
from slimecli.swe.synth.choices import choice_fields, wrong_files, wrong_patches
from slimecli.swe.synth.mutate import Mutation, find
from slimecli.swe.synth.rows import Kept, build, test_file
from slimecli.swe.synth.source import Source, SourceError, TaskRepo, materialize
from slimecli.swe.synth.suite import SuiteError, SuiteRun, Worker, make_probe_dir
from slimecli.swe.task import SweTask, parse_row

NOT_SOURCE = frozenset({"setup.py", "conftest.py", "versioneer.py", "_version.py", "noxfile.py", "fabfile.py"})
BROKEN = ("failed", "error")


class SynthError(Exception):
    """Synthesis cannot start or cannot go on (SRC unusable, no environment, no passing test)."""


@dataclass(frozen=True)
class Options:
    max_tasks: int = 20
    seed: int = 0
    jobs: int = 2
    max_fail: int = 10  # K: a bug that breaks more passing tests than this is too coarse to keep
    max_pass: int = 50  # PASS_TO_PASS kept per task (sampled)
    per_function: int = 3  # candidates tried per function, so that the tasks spread over the code
    budget_s: float = 600.0  # one grading of `tasks check`
    suite_timeout_s: float = 1800.0  # the suite at base
    choices: int = 0  # >= 2: each row lists the gold edit and choices-1 wrong ones (agent.constrain=choices)


@dataclass
class Report:
    project: str = ""
    version: str = ""
    environment: str = ""
    tests: int = 0
    passing: int = 0
    candidates: int = 0  # covered edits available
    tried: int = 0
    broke: int = 0  # broke 1..K tests and nothing else
    rejected: Counter[str] = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)
    base_s: float = 0.0
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"project": self.project, "version": self.version, "environment": self.environment,
                "tests": self.tests, "passing": self.passing, "candidates": self.candidates, "tried": self.tried,
                "broke": self.broke, "kept": len(self.rows), "rejected": dict(sorted(self.rejected.items())),
                "base_s": round(self.base_s, 2), "elapsed_s": round(self.elapsed_s, 2)}


def order(candidates: list[tuple[Mutation, frozenset[str]]], seed: int,
          per_function: int) -> list[tuple[Mutation, frozenset[str]]]:
    """The seeded order in which candidates are tried: round-robin over shuffled functions."""
    rng = random.Random(seed)
    by_function: dict[tuple[str, str], list[tuple[Mutation, frozenset[str]]]] = {}
    for item in candidates:
        by_function.setdefault((item[0].path, item[0].function), []).append(item)
    functions = sorted(by_function)
    rng.shuffle(functions)
    lanes = []
    for fn in functions:
        items = by_function[fn]
        rng.shuffle(items)
        seen: Counter[str] = Counter()
        ranked = []
        for item in items:
            ranked.append((seen[item[0].kind], item))
            seen[item[0].kind] += 1
        lanes.append([item for _, item in sorted(ranked, key=lambda r: r[0])][:per_function])
    return [lane[i] for i in range(per_function) for lane in lanes if i < len(lane)]


def covered_candidates(source: Source, base: SuiteRun) -> list[tuple[Mutation, frozenset[str]]]:
    """Every edit of a library line that passing tests run (and nothing runs at import), with those tests."""
    passing = base.passing()
    found = []
    for path in sorted(base.coverage):
        name = path.rsplit("/", 1)[-1]
        file = source.tree / path
        if not path.endswith(".py") or path.startswith("..") or is_protected(path) or name in NOT_SOURCE \
                or not file.is_file():
            continue
        lines = base.coverage[path]
        for m in find(path, file.read_bytes()):
            runners = lines.get(m.line, set())
            tests = frozenset(runners & passing)
            if tests and "" not in runners:
                found.append((m, tests))
    return found


class Synth:
    def __init__(self, src: Path, out: Path, repo_dir: Path, options: Options, settings: TaskConfig,
                 sandbox: SandboxConfig, say: Callable[[str], None]) -> None:
        self.src, self.out, self.repo_dir, self.options = src, out, repo_dir.resolve(), options
        self.settings, self.sandbox_settings, self.say = settings, sandbox, say
        self.report = Report()

    async def run(self) -> Report:
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="slimecli-synth-") as tmp_name:
            tmp = Path(tmp_name)
            (tmp / "home").mkdir()
            (tmp / "src").mkdir()
            try:
                source = materialize(self.src, tmp / "src")
                self.repo = TaskRepo.create(self.repo_dir, str(tmp / "home"))
                self.clean = self.repo.import_tree(source.tree)
            except SourceError as exc:
                raise SynthError(str(exc)) from None
            self.source = source
            self.report.project, self.report.version = source.name, source.version
            workers = await self._workers(tmp)
            try:
                await self._synthesize(workers)
            finally:
                for w in workers:
                    w.close()
        self.report.elapsed_s = time.monotonic() - start
        self._write()
        return self.report

    async def _workers(self, tmp: Path) -> list[Worker]:
        from slimecli.sandbox.factory import grader_factory
        from slimecli.swe.env.resolve import EnvUnavailable, describe, resolve

        commit = self.repo.commit(self.clean, {}, [], self.source.name, "refs/heads/clean")
        probe_task = SweTask(f"{self.source.name}.synth-base", self.source.name, commit, "-", "-", "-", ("-",), (),
                             workdir=str(self.repo_dir))
        try:
            env = await asyncio.to_thread(resolve, probe_task, self.settings, self.sandbox_settings)
        except EnvUnavailable as exc:
            raise SynthError(f"no environment for {self.source.name}: env:{exc.reason}: {describe(exc)}") from None
        if env.kind == "image":
            raise SynthError("tasks synth runs the suite in a host or venv environment; task.environment=image "
                             "(or a container sandbox with an image row) is not supported")
        self.report.environment = f"{env.kind} ({env.why})"
        try:
            probe_dir = make_probe_dir(tmp / "probe")
        except SuiteError as exc:
            raise SynthError(str(exc)) from None
        factory = grader_factory(self.sandbox_settings, path_dirs=env.path_dirs,
                                 ro_paths=(*env.ro_paths, str(probe_dir)))
        return [Worker(tmp / f"worker{i}", self.source.tree, probe_dir, factory) for i in range(self.options.jobs)]

    async def _synthesize(self, workers: list[Worker]) -> None:
        o = self.options
        try:
            base = await workers[0].run(None, o.suite_timeout_s, cover=True)
        except SuiteError as exc:
            raise SynthError(str(exc)) from None
        if base.timed_out:
            raise SynthError(f"the suite at base took over {o.suite_timeout_s:.0f}s")
        self.base, self.passing = base, base.passing()
        r = self.report
        r.tests, r.passing, r.base_s = len(base.tests), len(self.passing), base.elapsed_s
        self.say(f"{r.project} {r.version}: {r.passing}/{r.tests} tests pass at base ({base.elapsed_s:.1f}s, "
                 f"environment {r.environment})")
        if not self.passing:
            errors = "; ".join(f"{k}: {v}" for k, v in list(base.collect_errors.items())[:3])
            raise SynthError(f"no test passes at base: {errors or base.output.strip()[-600:]}")
        candidates = order(covered_candidates(self.source, base), o.seed, o.per_function)
        r.candidates = len(candidates)
        self.say(f"{len(candidates)} candidate bugs in covered functions; trying them {o.jobs} at a time")
        self.timeout_s = max(30.0, 3 * base.elapsed_s)
        pool: asyncio.Queue[Worker] = asyncio.Queue()
        for w in workers:
            pool.put_nowait(w)
        pending: list[Kept] = []
        window = 2 * o.jobs
        for i in range(0, len(candidates), window):
            if len(r.rows) >= o.max_tasks:
                break
            batch = candidates[i:i + window]
            results = await asyncio.gather(*(self._try(pool, m, tests) for m, tests in batch))
            r.tried += len(batch)
            pending += [k for k in results if isinstance(k, Kept)]
            r.broke += sum(isinstance(k, Kept) for k in results)
            while pending and len(r.rows) < o.max_tasks:
                need = o.max_tasks - len(r.rows)
                chosen, pending = pending[:need], pending[need:]
                await self._check(chosen)
            self.say(f"tried {r.tried}/{len(candidates)}: {r.broke} broke 1..{o.max_fail} tests, "
                     f"{len(r.rows)} valid tasks")

    async def _try(self, pool: asyncio.Queue[Worker], m: Mutation, tests: frozenset[str]) -> Kept | None:
        original = (self.source.tree / m.path).read_bytes()
        mutated = m.apply(original)
        if mutated is None:
            self.report.rejected["does_not_compile"] += 1
            return None
        files = sorted({test_file(t) for t in tests})
        worker = await pool.get()
        try:
            worker.write(m.path, mutated)
            run = await worker.run(files, self.timeout_s)
        finally:
            worker.write(m.path, original)
            pool.put_nowait(worker)
        why = self._verdict(run, files)
        if why:
            self.report.rejected[why] += 1
            return None
        expected = {t for t in self.passing if test_file(t) in files}
        f2p = sorted(t for t in expected if run.tests[t].status in BROKEN)
        return Kept(m, original, mutated, f2p, sorted(expected - set(f2p)), {t: run.tests[t].message for t in f2p})

    def _verdict(self, run: SuiteRun, files: list[str]) -> str:
        if run.timed_out:
            return "timeout"
        if run.collect_errors:
            return "collection_error"
        expected = {t for t in self.passing if test_file(t) in files}
        if expected - set(run.tests):
            return "tests_missing"
        broken = [t for t in expected if run.tests[t].status in BROKEN]
        if not broken:
            return "survived"
        if len(broken) > self.options.max_fail:
            return "too_many_failed"
        if any(run.tests[t].status != "passed" for t in expected if t not in broken):
            return "flaky"
        return ""

    async def _check(self, chosen: list[Kept]) -> None:
        from slimecli.swe.check import check_all
        from slimecli.swe.env.resolve import grading_sandboxes

        o = self.options
        rows = [await asyncio.to_thread(build, k, project=self.source.name, version=self.source.version,
                                        repo=self.repo, clean_tree=self.clean, max_p2p=o.max_pass, seed=o.seed,
                                        workdir=str(self.repo_dir)) for k in chosen]
        if o.choices >= 2:
            rows = [row for row, k in zip(rows, chosen, strict=True) if self._add_choices(row, k)]
        tasks: list[SweTask] = []
        for row in rows:
            parsed = parse_row(row, f"{self.out}:{row['instance_id']}")
            assert isinstance(parsed, SweTask), parsed
            tasks.append(parsed)
        results = await check_all(tasks, concurrency=o.jobs, budget_s=o.budget_s,
                                  sandboxes_for=lambda t: grading_sandboxes(t, self.settings, self.sandbox_settings))
        wrong_ok = [True] * len(rows)
        if o.choices >= 2:
            limit = asyncio.Semaphore(o.jobs)
            wrong_ok = await asyncio.gather(*(self._wrong_choices_fail(row, task, limit) if result.ok else _true()
                                              for row, task, result in zip(rows, tasks, results, strict=True)))
        for row, result, fine in zip(rows, results, wrong_ok, strict=True):
            if result.ok and not fine:
                self.report.rejected["check:choices"] += 1
                self.say(f"dropped {row['instance_id']}: a wrong choice resolves it or does not apply")
                await asyncio.to_thread(self.repo.git, "update-ref", "-d", f"refs/tasks/{row['instance_id']}")
            elif result.ok:
                self.report.rows.append(row)
            else:
                failed = next(c.name for c in result.checks if not c.ok)
                self.report.rejected[f"check:{failed}"] += 1
                self.say(f"dropped {row['instance_id']}: {result.why[:300]}")
                await asyncio.to_thread(self.repo.git, "update-ref", "-d", f"refs/tasks/{row['instance_id']}")

    def _add_choices(self, row: dict[str, Any], kept: Kept) -> bool:
        m, want = kept.mutation, self.options.choices - 1
        wrong = wrong_files(m, kept.original, kept.mutated, self.base.coverage.get(m.path, {}),
                            set(kept.fail_to_pass), want, self.options.seed)
        if len(wrong) < want:
            self.report.rejected["too_few_wrong_edits"] += 1
            self.say(f"dropped {row['instance_id']}: {len(wrong)} wrong edits found, {want} needed")
            return False
        row.update(choice_fields(row["instance_id"], m.path, kept.mutated, row["patch"], wrong))
        return True

    async def _wrong_choices_fail(self, row: dict[str, Any], task: SweTask, limit: asyncio.Semaphore) -> bool:
        """Whether every wrong choice applies and none resolves the task (graded like an agent's diff)."""
        from slimecli.swe.env.resolve import grading_sandboxes
        from slimecli.swe.grade import Unevaluatable, grade

        try:
            factory = await asyncio.to_thread(grading_sandboxes, task, self.settings, self.sandbox_settings)
            reports = [await grade(task, patch, sandbox_factory=factory, budget_s=self.options.budget_s,
                                   limiter=limit) for patch in wrong_patches(row)]
        except Unevaluatable:
            return False
        return all(r.applied and not r.resolved for r in reports)

    def _write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(f".{self.out.name}.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in self.report.rows))
        tmp.replace(self.out)


async def _true() -> bool:
    return True


async def synthesize(src: Path, out: Path, repo_dir: Path, options: Options, settings: TaskConfig,
                     sandbox: SandboxConfig, say: Callable[[str], None] = lambda _: None) -> Report:
    """Make up to options.max_tasks valid tasks from `src` into `out` (JSONL) and the repository `repo_dir`."""
    return await Synth(src, out, repo_dir, options, settings, sandbox, say).run()

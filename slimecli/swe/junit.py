"""pytest JUnit XML -> the status of each expected test node id.

JUnit knows tests by (classname, name), not by node id, so the grader maps each expected node id to that
pair the way pytest's junitxml plugin builds it, and looks it up. A test the report does not mention is
"missing" and counts as not passed; a report that cannot be read makes every test "missing", with the
reason kept. Only "passed" passes: a skip or an xfail raised from the code under test must not earn reward.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

MAX_BYTES = 64 * 1024 * 1024  # a report beyond this is broken (or hostile), not parsed
PASSED, FAILED, ERROR, SKIPPED, MISSING = "passed", "failed", "error", "skipped", "missing"
# When a pair appears twice (a setup error reported beside the call, a rerun plugin), the worst status wins.
_RANK = {PASSED: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}


@dataclass
class JUnitReport:
    cases: dict[tuple[str, str], str] = field(default_factory=dict)  # (classname, name) -> status
    error: str | None = None  # why the report could not be read; then `cases` is empty

    def status(self, node_id: str) -> str:
        return self.cases.get(junit_key(node_id), MISSING)

    def statuses(self, node_ids: list[str] | tuple[str, ...]) -> dict[str, str]:
        return {node_id: self.status(node_id) for node_id in node_ids}


def junit_key(node_id: str) -> tuple[str, str]:
    """pytest's (classname, name) for a node id: "a/b.py::C::t[x]" -> ("a.b.C", "t[x]").

    The parameter part is cut off first: it may hold "::", "/" or ".py" of its own."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def _case_status(case: ET.Element) -> str:
    tags = {child.tag for child in case}
    if "error" in tags:
        return ERROR
    if "failure" in tags:
        return FAILED
    if "skipped" in tags:
        return SKIPPED
    return PASSED


def parse(text: str | bytes | None) -> JUnitReport:
    """Every testcase of a report; never raises (a broken report comes back with `error` set)."""
    if text is None:
        return JUnitReport(error="no report")
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
    if len(data) > MAX_BYTES:
        return JUnitReport(error=f"report too large ({len(data)} bytes > {MAX_BYTES})")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:  # pytest writes neither; entities only serve attacks
        return JUnitReport(error="report has a DOCTYPE or ENTITY declaration")
    try:
        root = ET.fromstring(data)
    except (ET.ParseError, ValueError, RecursionError) as exc:
        return JUnitReport(error=f"malformed report: {exc}")
    if root.tag not in ("testsuites", "testsuite"):
        return JUnitReport(error=f"not a JUnit report (root element <{root.tag}>)")
    report = JUnitReport()
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        status = _case_status(case)
        if _RANK[status] >= _RANK.get(report.cases.get(key, PASSED), 0):
            report.cases[key] = status
    return report

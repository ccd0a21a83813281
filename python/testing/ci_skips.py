"""A pytest plugin (``-p ci_skips``, from scripts/python-test.sh): a test
that skips says why on one line, and under ``CI`` (set and not ``false``) a
skip fails unless tests/allowed-skips.txt names the test with its reason.
So a missing install step or a failed wheel download fails CI instead of
passing as a skip."""

import os
from pathlib import Path

import pytest

_ALLOWED = Path(__file__).resolve().parents[2] / "tests" / "allowed-skips.txt"


def _allowed() -> set[str]:
    names = set()
    if _ALLOWED.exists():
        for line in _ALLOWED.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                names.add(line.split(":", 1)[0].strip())
    return names


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped:
        return
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    name = item.originalname or item.name
    ci = os.environ.get("CI", "") not in ("", "false")
    if ci and name not in _allowed():
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} did not run under CI ({why}): a skip fails CI unless "
                           f"tests/allowed-skips.txt lists {name} with its reason")

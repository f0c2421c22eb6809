"""pytest setup of the reference suite. Each file is one ctest entry (label `reference`); a file
whose every test was skipped (a reference library or ../shared missing) exits 77, which ctest
reports as skipped rather than passed."""

import os
import sys

import pytest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_outcomes = {"passed": 0, "skipped": 0, "failed": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.outcome] = _outcomes.get(report.outcome, 0) + 1


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _outcomes["passed"] == 0 and _outcomes["skipped"] > 0:
        session.exitstatus = 77


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)

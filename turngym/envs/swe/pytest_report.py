"""A standalone pytest plugin copied into task images (``-p turngym_pytest_report``).

With ``TURNGYM_REPORT=/path.json`` it writes ``{"tests": {nodeid: {"outcome", "message"}}}`` where
``outcome`` is ``passed``, ``failed``, ``error`` or ``skipped`` and ``message`` is the crash line of a
failure (the observed behaviour, never the test's source). With ``TURNGYM_PROFILE=/path.json`` it
also records which functions under ``TURNGYM_PROFILE_ROOT`` ran (``[file, first line]`` pairs): the
coverage that task synthesis mutates. It imports nothing from turngym.
"""

import json
import os
import sys
import threading

_tests = {}
_called = set()


def _profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        _called.add((code.co_filename, code.co_firstlineno))


def pytest_configure(config):
    if os.environ.get("TURNGYM_PROFILE"):
        sys.setprofile(_profile)
        threading.setprofile(_profile)


def _record(nodeid, outcome, message):
    prev = _tests.get(nodeid)
    if prev is not None and prev["outcome"] in ("failed", "error"):
        return  # a teardown pass never hides an earlier failure
    _tests[nodeid] = {"outcome": outcome, "message": message}


def pytest_runtest_logreport(report):
    message = ""
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = (crash.message if crash is not None else str(report.longrepr))[:2000]
    if report.when == "call":
        _record(report.nodeid, report.outcome, message)
    elif report.failed:
        _record(report.nodeid, "error", message)
    elif report.skipped:
        _record(report.nodeid, "skipped", "")


def pytest_collectreport(report):
    if report.failed:
        _record(report.nodeid or "<collection>", "error", str(report.longrepr)[-2000:])


def pytest_sessionfinish(session, exitstatus):
    sys.setprofile(None)
    path = os.environ.get("TURNGYM_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"tests": _tests, "exitstatus": int(exitstatus)}, f)
    prof = os.environ.get("TURNGYM_PROFILE")
    if prof:
        root = os.environ.get("TURNGYM_PROFILE_ROOT", "/testbed")
        called = sorted([f, n] for f, n in _called if f.startswith(root))
        with open(prof, "w") as f:
            json.dump(called, f)

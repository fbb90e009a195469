"""The process that runs a patch's graded tests; standalone (copied into the grading container).

Started as ``python3 -I -S grade_harness.py`` with a clean environment, it reads one JSON line from
stdin (``nonce``, ``targets``, ``test_files``, ``report``, ``plugin``) before anything of the
repository is imported, then:

* builds ``sys.path`` from the image's read-only site directories only (no user site, no
  ``sitecustomize``/``usercustomize``, no ``PYTHONPATH``, not the current directory);
* compiles the pristine test files itself and keeps a fingerprint of every function's code;
* installs a tracer (``sys.settrace`` and ``threading.settrace``) that notes, per test id, which
  fingerprinted test functions returned normally or raised during the test's *call* phase;
* keeps the identity of the objects a tamperer would patch (pytest's run protocol, ``unittest``,
  ``os._exit``, the tracer hooks) and says which of them changed;
* runs pytest in-process with plain asserts and no cache, and writes one JSON report (outcomes,
  evidence, problems, the nonce) to ``report``, then leaves with ``os._exit`` (no exit hooks).

The host trusts a pass only with the evidence (``turngym.envs.swe.grading``). It imports nothing
from turngym.
"""

import json
import os
import sys


def _qual(code):
    """The code's qualified name (``co_qualname`` is Python 3.11+; older ones have ``co_name`` only)."""
    return getattr(code, "co_qualname", code.co_name)


def _fingerprint(code, memo):
    """A digest of a code object's bytecode, names and constants (nested code included)."""
    import hashlib

    got = memo.get(code)
    if got is not None:
        return got
    parts = [code.co_code, repr(code.co_names), repr(code.co_varnames), repr(code.co_freevars)]
    parts += [repr(code.co_cellvars), str(code.co_flags), str(code.co_argcount), _qual(code)]
    parts.append(str(code.co_firstlineno))
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            parts.append("code:" + _fingerprint(c, memo))
        elif isinstance(c, frozenset):
            parts.append("fs:" + repr(sorted(repr(x) for x in c)))
        else:
            parts.append(type(c).__name__ + ":" + repr(c))
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    memo[code] = got = h.hexdigest()
    return got


def _expected(paths):
    """(filename, qualname, first line) -> fingerprints of the code in the pristine files (a set: two
    lambdas on one line share a key)."""
    out, memo = {}, {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            continue
        out.setdefault((path, _qual(code), code.co_firstlineno), set()).add(_fingerprint(code, memo))
        stack = [code]
        while stack:
            c = stack.pop()
            for k in c.co_consts:
                if hasattr(k, "co_code"):
                    out.setdefault((path, _qual(k), k.co_firstlineno), set()).add(_fingerprint(k, memo))
                    stack.append(k)
    return out


def _site_path():
    import site

    for d in site.getsitepackages():
        if os.path.isdir(d):
            site.addsitedir(d)


def main():
    cfg = json.loads(sys.stdin.readline())
    nonce, report_path = cfg["nonce"], cfg["report"]
    exit_now, write, gettrace, settrace = os._exit, os.write, sys.gettrace, sys.settrace
    _site_path()
    import builtins
    import importlib.util
    import inspect
    import threading
    import unittest

    import _pytest.python
    import _pytest.reports
    import _pytest.runner
    import _pytest.unittest
    import pytest

    spec = importlib.util.spec_from_file_location("turngym_pytest_report", cfg["plugin"])
    reporter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reporter)

    paths = [os.path.join(cfg.get("root", "/testbed"), p) for p in cfg["test_files"]]
    expected = _expected(paths)
    names = sorted({q.rsplit(".", 1)[-1] for (_, q, _) in expected})
    watched = frozenset(paths)
    fp_memo, genuine, foreign = {}, {}, set()
    current = [None]
    returned, raised = {}, {}

    def local_tracer(code):
        last = [None]

        def trace(frame, event, arg):
            if event == "return":
                node = current[0]
                if node is not None:
                    into = raised if last[0] == "exception" else returned
                    into.setdefault(node, set()).add(code.co_name)
            last[0] = event
            return trace

        return trace

    def tracer(frame, event, arg):
        code = frame.f_code
        if code.co_filename not in watched:
            return None
        ok = genuine.get(code)
        if ok is None:
            key = (code.co_filename, _qual(code), code.co_firstlineno)
            ok = genuine[code] = _fingerprint(code, fp_memo) in expected.get(key, ())
            if not ok:
                foreign.add(f"{code.co_filename}:{_qual(code)}")
        if not ok or current[0] is None:
            return None
        return local_tracer(code)

    guarded = {
        "os._exit": (os, "_exit"),
        "sys.exit": (sys, "exit"),
        "sys.settrace": (sys, "settrace"),
        "sys.gettrace": (sys, "gettrace"),
        "threading.settrace": (threading, "settrace"),
        "_pytest.python.Function.runtest": (_pytest.python.Function, "runtest"),
        "_pytest.python.pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
        "_pytest.runner.runtestprotocol": (_pytest.runner, "runtestprotocol"),
        "_pytest.runner.call_and_report": (_pytest.runner, "call_and_report"),
        "_pytest.runner.CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
        "_pytest.reports.TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
        "_pytest.unittest.TestCaseFunction.runtest": (_pytest.unittest.TestCaseFunction, "runtest"),
        "unittest.TestCase.run": (unittest.TestCase, "run"),
        "unittest.TestCase.__call__": (unittest.TestCase, "__call__"),
        "unittest.case._Outcome.testPartExecutor": (unittest.case._Outcome, "testPartExecutor"),
        "builtins.__import__": (builtins, "__import__"),
    }
    static = inspect.getattr_static  # the stored object: a classmethod is not re-bound on each access
    originals = {name: static(obj, attr, None) for name, (obj, attr) in guarded.items()}
    problems = []

    class Evidence:
        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            current[0] = item.nodeid
            try:
                yield
            finally:
                current[0] = None
                if gettrace() is not tracer:
                    problems.append(f"the grader's tracer was removed during {item.nodeid}")
                    settrace(tracer)

    settrace(tracer)
    threading.settrace(tracer)
    args = ["-q", "--tb=line", "-p", "no:cacheprovider", "--assert=plain", *cfg["targets"]]
    try:
        status = int(pytest.main(args, plugins=[reporter, Evidence()]))
    except BaseException as e:  # noqa: BLE001 - whatever the tests raise, the report is written
        status = -1
        problems.append(f"pytest did not return: {type(e).__name__}: {e}"[:500])
    settrace(None)
    for name, (obj, attr) in guarded.items():
        if static(obj, attr, None) is not originals[name]:
            problems.append(f"{name} was replaced")
    report = {
        "nonce": nonce,
        "status": status,
        "tests": reporter._tests,
        "returned": {k: sorted(v) for k, v in returned.items()},
        "raised": {k: sorted(v) for k, v in raised.items()},
        "names": names,
        "foreign": sorted(foreign)[:50],
        "problems": problems,
    }
    fd = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    data = json.dumps(report).encode()
    while data:
        data = data[write(fd, data) :]
    os.close(fd)
    exit_now(0)


if __name__ == "__main__":
    main()

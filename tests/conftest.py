"""Test configuration: hardware markers and the source tree on sys.path for uninstalled checkouts.

RTC_TESTS_PYTHON_DIR names another dir to import rtcattn from: .ci/sanitize points it at the sanitized
copy of the package (build/sanitize/python)."""
import gc
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON_DIR = os.path.abspath(os.environ.get("RTC_TESTS_PYTHON_DIR") or os.path.join(ROOT, "python"))
for p in (PYTHON_DIR, os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)


def pytest_configure(config):
    if os.environ.get("RTC_TESTS_PYTHON_DIR"):  # a run of another copy must really test that copy
        import rtcattn
        if not os.path.abspath(rtcattn.__file__).startswith(PYTHON_DIR + os.sep):
            raise pytest.UsageError(f"RTC_TESTS_PYTHON_DIR={PYTHON_DIR} but rtcattn imports from {rtcattn.__file__}")
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU (skipped only where none exists)")
    config.addinivalue_line("markers", "emu: runs kernels on the CPU wave emulator")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "no_asan: cannot run with ASan loaded (e.g. limits its child's address space); "
                                       "skipped by bash .ci/sanitize")


def pytest_collection_finish(session):
    # Everything alive now (torch's and the collected tests' objects, about 200 thousand) stays alive for the whole
    # run: frozen, the cyclic collector stops walking it at each full collection (3% of a CI run's CPU was there).
    gc.freeze()


def _gpu_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _asan_loaded():
    return "libasan" in os.environ.get("LD_PRELOAD", "")


def _run_sanitized(nodeid: str, entries) -> bool:
    """Whether a test id is one of the sanitizer subset's entries (a file, a test, or a test with its parameters)."""
    return any(nodeid == e or nodeid.startswith(e + "::") or nodeid.startswith(e + "[") for e in entries)


def pytest_collection_modifyitems(config, items):
    if _asan_loaded():  # ASan reserves terabytes of address space: an RLIMIT_AS child cannot start
        no_asan = pytest.mark.skip(reason="cannot run under ASan (bash .ci/sanitize)")
        for item in items:
            if "no_asan" in item.keywords:
                item.add_marker(no_asan)
    else:
        # The test command runs a subset under ASan + UBSan beside the suite (.ci/run): the same tests, the same
        # assertions, with the sanitizers' checks besides. The suite leaves those out (RTC_TESTS_SANITIZED: the
        # subset's entries), all but the ones that cannot run under ASan, so that each runs once.
        entries = os.environ.get("RTC_TESTS_SANITIZED", "").split()
        if entries:
            elsewhere = [i for i in items if _run_sanitized(i.nodeid, entries) and "no_asan" not in i.keywords]
            if elsewhere:
                config.hook.pytest_deselected(items=elsewhere)
                items[:] = [i for i in items if i not in set(elsewhere)]
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no GPU on this machine (run on a GPU: bash .ci/device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

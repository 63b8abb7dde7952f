"""Test configuration: hardware markers and the source tree on sys.path for uninstalled checkouts."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU (skipped only where none exists)")
    config.addinivalue_line("markers", "emu: runs kernels on the CPU wave emulator")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def _gpu_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no GPU on this machine (run on a GPU: bash .ci/device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

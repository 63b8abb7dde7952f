"""Helpers shared by the test files."""
from rtcattn.runtime import dispatch


def need_lib():
    """The C++ runtime: the suite runs on a built package, so a load failure fails the test."""
    return dispatch.lib()

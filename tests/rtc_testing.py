"""Helpers shared by the test files."""
from rtcattn.runtime import dispatch, manifest


def need_lib():
    """The C++ runtime: the suite runs on a built package, so a load failure fails the test."""
    return dispatch.lib()


def round_modes(op: str = "attention_fwd") -> tuple:
    """The op's round modes as the manifest declares them, in its order: tests take the set of modes to cover from
    here, so a mode added to or dropped from the manifest is tested (or not) without editing each test."""
    return tuple(manifest.load().op(op).axis_values("round_mode"))

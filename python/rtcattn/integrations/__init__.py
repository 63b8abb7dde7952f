"""Clients of rtcattn's public calls: each module makes one framework run on rtcattn's kernels (optional
dependencies: `pip install rtcattn[<name>]`)."""

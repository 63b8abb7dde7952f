"""The gfx9 instruction classes that the code-object report (coreport) counts and the static models time."""
import re

# Transcendental VALU ops: quarter rate (a wave64 issues one in 16 cycles, where a plain VALU op takes 4).
TRANSCENDENTAL = re.compile(r"^v_(exp|log|rcp|rsq|sqrt|sin|cos)_f32")

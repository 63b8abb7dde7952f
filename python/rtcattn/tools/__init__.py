"""Command-line tools: the CLI (`python -m rtcattn`) and the first-call measurement."""

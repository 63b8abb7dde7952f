"""Entry point of `python -m rtcattn`."""
import sys

from .tools.cli import main

sys.exit(main())

"""Entry point of `python -m rtcattn`."""
import sys

from .cli import main

sys.exit(main())

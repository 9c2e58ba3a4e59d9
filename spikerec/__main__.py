"""``python -m spikerec``: the ``spikerec`` command."""
import sys

from .cli import main

sys.exit(main())

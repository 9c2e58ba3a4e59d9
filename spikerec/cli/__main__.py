"""``python -m spikerec.cli``: the ``spikerec`` command."""
import sys

from . import main

sys.exit(main())

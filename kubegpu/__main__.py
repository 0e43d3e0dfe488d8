"""``python -m kubegpu``: same as the ``kubegpu`` command."""

import sys

from kubegpu.cli import main

sys.exit(main())

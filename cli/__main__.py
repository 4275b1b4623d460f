"""``python -m mrclab.cli``: the ``mrclab`` command line (see :mod:`mrclab.cli.main`)."""

import sys

from mrclab.cli.main import main

sys.exit(main())

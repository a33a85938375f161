"""``python -m devtools.bench``: see :mod:`devtools.bench.runner`."""

import sys

from devtools.bench.runner import main

sys.exit(main())

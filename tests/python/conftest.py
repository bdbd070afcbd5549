"""pytest's first stop in this folder: the bindings under python/ importable
when a test file is run by hand (ctest sets PYTHONPATH to the same folder).
Tests of the mooncake.engine drop-in put python/compat first themselves:
only they want `import mooncake` to find it."""

import os
import sys

PYDIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

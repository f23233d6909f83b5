"""CTest's entry to the Python tests: runs pytest on tests/python with the
package built in the build tree (PYTHONPATH), or prints SKIP and exits 77 when
numpy or pytest is missing."""
import os
import sys

missing = []
for mod in ("numpy", "pytest"):
    try:
        __import__(mod)
    except ImportError:
        missing.append(mod)
if missing:
    print("SKIP: the Python tests need %s, which %s lacks (%s -m pip install numpy pytest; or choose another "
          "interpreter: PYTHON=/path/to/python3 scripts/test.sh, or cmake -DPython3_EXECUTABLE=/path/to/python3)"
          % (" and ".join(missing), sys.executable, sys.executable))
    sys.exit(77)

import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", here] + sys.argv[1:]))

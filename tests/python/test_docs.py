"""docs/python.md's examples run: every ```python block, each in a fresh
interpreter on the host back end (a block that fails or crashes fails here)."""
import os
import re
import subprocess
import sys

import pytest

import mapping

HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.join(HERE, "..", "..", "docs", "python.md")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mapping.__file__)))


def blocks():
    text = open(DOC).read()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_page_has_examples():
    assert len(blocks()) >= 5


@pytest.mark.parametrize("index", range(len(blocks())))
def test_python_md_example_runs(index):
    code = "import numpy as np\nimport mapping\n" + blocks()[index]
    env = dict(os.environ, MAPPING_BACKEND="host", PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "example %d failed (%d):\n%s\n--- stderr\n%s" % (index, r.returncode, code, r.stderr)

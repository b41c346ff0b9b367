"""The README's Python examples run as written (a newcomer's first contact must not be broken)."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("k", range(len(BLOCKS)))
def test_readme_python_block_runs(k):
    exec(compile(BLOCKS[k], f"README.md[python block {k}]", "exec"), {})

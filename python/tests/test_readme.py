# SPDX-License-Identifier: MIT
"""The Python snippets of the top-level README.md run as written: each fenced
```python block in a fresh interpreter. Blocks that need a GPU (they name
emu-gpu:, CUDA or a PageCache) are GPU tests, skipped without one."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
_GPU_WORDS = re.compile(r"emu-gpu:|cuda|PageCache|bam\.Array")


def python_blocks(text):
    """(first line number, code) of each fenced ```python block."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"README.md:{i + 1}: a ```python block is not closed")
            blocks.append((start + 1, "\n".join(lines[start:j]) + "\n"))
            i = j
        i += 1
    return blocks


def _cases():
    if not README.exists():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"{README} not found (not a source tree)"))]
    cases = []
    for line, code in python_blocks(README.read_text()):
        marks = [pytest.mark.gpu] if _GPU_WORDS.search(code) else []
        cases.append(pytest.param(line, code, id=f"README.md:{line}", marks=marks))
    return cases


def test_block_parser():
    text = "x\n```python\nprint(1)\n```\n```sh\nls\n```\n```python\na = 2\nb = 3\n```\n"
    assert python_blocks(text) == [(3, "print(1)\n"), (9, "a = 2\nb = 3\n")]
    with pytest.raises(ValueError, match="not closed"):
        python_blocks("```python\nprint(1)\n")


def test_readme_has_a_snippet_that_runs_without_a_gpu():
    if not README.exists():
        pytest.skip(f"{README} not found (not a source tree)")
    assert any(not _GPU_WORDS.search(code) for _, code in python_blocks(README.read_text()))


@pytest.mark.parametrize("line, code", _cases())
def test_readme_python_block_runs(line, code, tmp_path):
    r = subprocess.run(
        # bam's own deprecations (an old argument order) fail the snippet.
        [sys.executable, "-W", "error:bam.:DeprecationWarning", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"README.md:{line} failed:\n{code}\n--- stderr:\n{r.stderr}"

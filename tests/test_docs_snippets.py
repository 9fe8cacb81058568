"""The python blocks of README.md and docs/*.md run as written. Each document's blocks run in order as one
program (a tutorial builds on its earlier blocks), in a fresh interpreter with 8 CPU devices, from a scratch
folder that sees the checkout's tests/data as the checkout's root does. A block that is not meant to run says
so, with the reason, in a comment on the line before it: `<!-- not run: reason -->`."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxcoll

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>[^>]*?)\s*-->\s*$")
# Programs that start processes of their own (jaxcoll.launch) take longer than the rest.
TIMEOUT_S = {"multiprocess.md": 600}


def python_blocks(document: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, reason it is not run or None) for each ```python block of `document`."""
    lines = document.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            mark = NOT_RUN.search(lines[i - 1]) if i > 0 else None
            blocks.append((start + 1, "\n".join(lines[start:end]), mark["reason"] if mark else None))
            i = end
        i += 1
    return blocks


def runnable(document: Path) -> bool:
    return any(reason is None for _, _, reason in python_blocks(document))


def test_every_not_run_mark_gives_a_reason_and_they_stay_rare():
    marks = [(d.name, line, reason) for d in DOCUMENTS for line, _, reason in python_blocks(d) if reason is not None]
    assert all(reason for _, _, reason in marks), marks
    total = sum(len(python_blocks(d)) for d in DOCUMENTS)
    assert len(marks) * 4 <= total, f"{len(marks)} of {total} python blocks are marked not run: {marks}"


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if runnable(d)], ids=lambda d: d.name)
def test_python_blocks_run_as_written(document, tmp_path):
    program = "\n\n".join(f"# {document.name}, line {line}\n{code}"
                          for line, code, reason in python_blocks(document) if reason is None)
    script = tmp_path / f"{document.stem}_snippets.py"
    script.write_text(program + "\n")
    (tmp_path / "tests").symlink_to(REPO / "tests")  # paths in the documents are relative to the checkout
    # The folder this session imports jaxcoll from goes first on the path, so the snippets import the same
    # jaxcoll (installed, editable, or a checkout on PYTHONPATH), never unbuilt sources from elsewhere.
    where = str(Path(jaxcoll.__file__).resolve().parents[1])
    path = os.pathsep.join([where] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = dict(os.environ, PYTHONPATH=path, JAX_NUM_CPU_DEVICES="8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=TIMEOUT_S.get(document.name, 300))
    assert out.returncode == 0, f"{document.name}'s python blocks failed:\n{out.stdout}\n{out.stderr[-4000:]}"

"""docs/api.md, run for real: every ```python block of the API reference is executed, so the
reference cannot drift from the code.

Each block runs on its own, in a fresh namespace that starts with
``import numpy as np, parcl as pc, parcl.tape as tp``. A block whose feature is not merged
yet carries ``<!-- not yet runnable -->`` on the line before its fence; those are not run,
and there may only be a handful of them (the test lists them). Every public name the
package exports must appear in the reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import parcl as pc
import parcl.allreduce
import parcl.data
import parcl.optim
import parcl.tape as tp

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
MARKER = "<!-- not yet runnable -->"
PRELUDE = "import numpy as np, parcl as pc, parcl.tape as tp\n"
MAX_MARKED = 0        # every example runs; a block that cannot is marked and named


def python_blocks(text: str) -> list[dict]:
    """Every ```python block: its source, first line number, section heading and marker."""
    blocks, lines = [], text.splitlines()
    heading, i = "top", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.strip() == "```python":
            previous = next((lines[j].strip() for j in range(i - 1, -1, -1)
                             if lines[j].strip()), "")
            start = i + 1
            i = start
            while lines[i].strip() != "```":
                i += 1
            blocks.append({"source": "\n".join(lines[start:i]), "line": start + 1,
                           "heading": heading, "marked": previous == MARKER})
        i += 1
    return blocks


BLOCKS = python_blocks(API_MD.read_text(encoding="utf-8"))
RUNNABLE = [b for b in BLOCKS if not b["marked"]]


def block_id(block: dict) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", block["heading"].lower()).strip("-")
    return f"line{block['line']}-{slug[:40]}"


def test_the_reference_has_examples_and_few_unmerged_ones():
    marked = [f"line {b['line']} ({b['heading']})" for b in BLOCKS if b["marked"]]
    assert len(RUNNABLE) >= 20, f"only {len(RUNNABLE)} runnable examples in docs/api.md"
    assert len(marked) <= MAX_MARKED, (
        f"{len(marked)} blocks of docs/api.md are marked {MARKER!r} (at most {MAX_MARKED}): "
        f"{marked}; make the merged ones runnable")


@pytest.mark.parametrize("block", RUNNABLE, ids=[block_id(b) for b in RUNNABLE])
def test_example_runs(block, queue):
    # `queue` makes the session's shared sub-device queue this thread's default queue, so the
    # examples reuse the kernels other tests compiled instead of building them again.
    namespace: dict = {"__name__": "docs_api_example"}
    code = compile(PRELUDE + block["source"], f"docs/api.md:{block['line'] - 1}", "exec")
    exec(code, namespace)     # noqa: S102 - the documentation's own examples


def exported_names() -> dict[str, list[str]]:
    return {"parcl": [n for n in pc.__all__ if not n.startswith("_")],
            "parcl.tape": list(tp.__all__),
            "parcl.nn": list(pc.nn.__all__),
            "parcl.optim": list(parcl.optim.__all__),
            "parcl.data": list(parcl.data.__all__),
            "parcl.allreduce": list(parcl.allreduce.__all__)}


def test_every_exported_name_is_documented():
    text = API_MD.read_text(encoding="utf-8")
    missing = [f"{module}.{name}" for module, names in exported_names().items()
               for name in names if not re.search(rf"\b{re.escape(name)}\b", text)]
    assert not missing, f"exported but not in docs/api.md: {missing}; add a line for each"


def test_readme_links_the_reference():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    docs = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    assert "(docs/api.md)" in docs
    assert "shared/API.md" not in readme

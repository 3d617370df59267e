"""The guides' commands run as a reader would run them, so that a guide that goes stale fails CI.

On docs/getting-started.md and docs/guides/*.md, every ```bash block runs (bash, `set -euo pipefail`) and every
```python block runs (its own `python` process), top to bottom, each page in a fresh empty directory, with the
installed `bertknn` first on PATH, $BERTKNN_DATA the shared data, the test run's private bertknn cache, offline and on
one thread. Blocks shown but not run (a GPU, downloads, a real cluster, long runs) are fenced ```sh; each page's
"Checked" note says which. The runs are in the smoke group (`--smoke`, run by CI after the suite); the page list and
its notes are checked by the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SHARED_DATA

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted([DOCS / "getting-started.md", *(DOCS / "guides").glob("*.md")])
FENCE = re.compile(r"^( *)```(bash|python|sh)\b[^\n]*\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
TIMEOUT_S = 600


def blocks(page: Path) -> list[tuple[str, str]]:
    """The page's fenced blocks as (language, code), in order; an indented block (in an admonition) dedented."""
    found = []
    for match in FENCE.finditer(page.read_text(encoding="utf-8")):
        indent = len(match.group(1))
        code = "".join(line[indent:] for line in match.group(3).splitlines(keepends=True))
        found.append((match.group(2), code))
    return found


def run_block(language: str, code: str, number: int, cwd: Path) -> subprocess.CompletedProcess:
    """One block in `cwd` as a reader runs it: bash with strict options, or a python file of its own."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "BERTKNN_DATA": str(SHARED_DATA),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if language == "bash":
        args = ["bash", "-c", "set -euo pipefail\n" + code]
    else:
        script = cwd / f"_block{number}.py"
        script.write_text(code, encoding="utf-8")
        args = [sys.executable, script.name]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_every_guide_says_what_its_tests_run():
    """Each page runs at least one block or says why none, and its "Checked" note exists."""
    assert len(PAGES) >= 9, PAGES
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert '!!! note "Checked"' in text, f"{page.name} has no Checked note"
        assert any(language != "sh" for language, _ in blocks(page)) or "not run" in text, page.name


def test_the_block_reader_finds_fences_in_admonitions(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("x\n```bash\necho a\n```\n!!! tip\n    ```python\n    print(1)\n    ```\n```sh\nrm -rf /\n```\n")
    assert blocks(page) == [("bash", "echo a\n"), ("python", "print(1)\n"), ("sh", "rm -rf /\n")]


@pytest.mark.smoke
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.stem)
def test_the_guide_runs(page, tmp_path):
    if not (SHARED_DATA / "lama").exists():
        pytest.skip(f"the guides read $BERTKNN_DATA ({SHARED_DATA})")
    for number, (language, code) in enumerate(blocks(page)):
        if language == "sh":
            continue
        result = run_block(language, code, number, tmp_path)
        assert result.returncode == 0, (
            f"{page.name}, block {number + 1} ({language}) exited {result.returncode}:\n{code}\n"
            f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
        )

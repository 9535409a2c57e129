"""The house style the tree keeps (.editorconfig, .clang-format): C++/CUDA lines of at most 120 columns, no tabs
or trailing blanks, a final newline, and a header comment opening every source file. clang-format itself is not
run here: its output drifts between versions, and these are the rules a version change cannot move."""
import subprocess

import pytest

from conftest import REPO

SUFFIXES = (".h", ".cpp", ".cu", ".cuh")


def tracked_sources():
    out = subprocess.run(["git", "ls-files", "src", "tools", "tests/cpp"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [REPO / f for f in out.stdout.split() if f.endswith(SUFFIXES)]


def test_sources_keep_the_column_limit_and_clean_whitespace():
    problems = []
    for path in tracked_sources():
        text = path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            problems.append(f"{path}: no final newline")
        for number, line in enumerate(text.split("\n"), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            if len(line) > 120:  # characters, as clang-format counts columns of UTF-8 text
                problems.append(f"{where}: {len(line)} columns")
            if "\t" in line:
                problems.append(f"{where}: tab")
            if line != line.rstrip():
                problems.append(f"{where}: trailing blank")
    assert not problems, "\n".join(problems[:40])


def test_every_source_file_opens_with_a_header_comment():
    missing = [str(p.relative_to(REPO)) for p in tracked_sources()
               if not p.read_text(encoding="utf-8").lstrip().startswith(("//", "/*"))]
    assert not missing, missing

"""The environment variable table (src/core/env.cpp): every NIBBLE_* variable the product reads is in
`nibble --help-env`, read through the table (no direct getenv), and diagnostics carry NIBBLE_DIAG_."""
import pathlib
import re
import subprocess

from conftest import REPO

READ = re.compile(r'(?:getenv|env_value|env_int|env_flag)\("(NIBBLE_[A-Z0-9_]+)"')


def sources():
    for root in ("src", "tools"):
        for path in (REPO / root).rglob("*"):
            if path.suffix in {".cpp", ".h", ".cu", ".cuh"}:
                yield path


def test_every_variable_read_is_in_the_table_and_help_env_lists_it(build_dir):
    listed = subprocess.run([str(build_dir / "nibble"), "--help-env"], capture_output=True, text=True, check=True).stdout
    names = set(re.findall(r"^  (NIBBLE_[A-Z0-9_]+)", listed, re.M))
    assert {"NIBBLE_LOG", "NIBBLE_THREADS", "NIBBLE_DATA_DIR"} <= names
    read = {}
    for path in sources():
        text = path.read_text(errors="replace")
        for name in READ.findall(text):
            read.setdefault(name, path)
        if path.name != "env.cpp":
            assert 'getenv("NIBBLE_' not in text, f"{path}: read NIBBLE_* through core/env.h"
    missing = {n: str(p) for n, p in read.items() if n not in names}
    assert not missing, missing
    unused = names - set(read)
    assert not unused, f"listed but never read: {unused}"
    for name in names - {"NIBBLE_LOG", "NIBBLE_THREADS", "NIBBLE_DATA_DIR"}:
        assert name.startswith("NIBBLE_DIAG_"), name

"""The suite tests this checkout's registrar, in this process and in every rank process, even
though the SGLang environment is shared by every checkout on the machine (its editable install
points at whichever one refreshed it last)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sglang_support.harness import ROOT, child_env

import registrar


def test_this_process_imports_this_checkout() -> None:
    assert Path(registrar.__file__).resolve().parent == ROOT / "registrar"


def test_a_rank_process_imports_this_checkout(tmp_path: Path) -> None:
    found = subprocess.run(
        [sys.executable, "-c", "import registrar; print(registrar.__file__)"],
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert Path(found).resolve().parent == ROOT / "registrar"

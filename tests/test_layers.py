"""The layering contracts in pyproject.toml ([tool.importlinter]) hold: the record contract
imports no part, storage no mirror/ingester/evaluator/api, nothing imports shadow_ab.dev, ..."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    # The interpreter's own scripts first (a venv that is not activated), then PATH.
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    lint_imports = lint_imports or shutil.which("lint-imports")
    assert lint_imports, "import-linter is missing: pip install -e '.[dev]'"
    proc = subprocess.run(
        [lint_imports, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout

"""Every import of poolsim's own code goes through ``poolsim.``: a bare ``import pools`` (or ``kernels``, ``traces``,
...) works only from the repository root, where it would load a second copy of the module beside the installed
one, and installed beside other distributions it would find theirs."""

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = {"pools", "sim", "traces", "reports", "kernels", "app", "telemetry", "cli", "compiled"}


def test_no_module_imports_poolsim_code_by_a_bare_top_level_name():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(files) > 100
    bare = []
    for rel in files:
        if rel == "setup.py":
            continue
        for node in ast.walk(ast.parse((ROOT / rel).read_text(), rel)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            bare += [f"{rel}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OWN]
    assert bare == []

"""bench/sim_against.py: an older commit beside this tree, in a worktree it removes again (never a timed test)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "sim_against.py"
SLICE = ROOT / "tests" / "traces" / "data" / "mooncake_conversation_head400.jsonl"


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True,
                          text=True, check=True).stdout


pytestmark = pytest.mark.skipif(
    shutil.which("git") is None
    or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0,
    reason="needs a git checkout of poolsim (the script checks the older commit out of it)")


def test_an_unknown_revision_is_one_error_line_and_leaves_no_worktree():
    before = _worktrees()
    res = subprocess.run([sys.executable, str(SCRIPT), "no-such-revision-0000", str(SLICE)], capture_output=True,
                         text=True)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1].startswith("error: cannot check out no-such-revision-0000: ")
    assert _worktrees() == before


@pytest.mark.parametrize("args, message", [
    (["HEAD", "no-such-trace.jsonl"], "no such trace file"),
    (["HEAD", str(SLICE), "--pairs", "0"], "error: --pairs '0': expected a whole number >= 1"),
])
def test_bad_arguments_are_one_error_line_before_any_checkout(args, message):
    before = _worktrees()
    res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert res.returncode != 0 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
    assert _worktrees() == before


def test_head_beside_this_tree_prints_a_ratio_per_case_and_removes_its_worktree(tmp_path):
    trace = tmp_path / "slice.jsonl"
    trace.write_text("".join(SLICE.read_text().splitlines(keepends=True)[:20]))
    before = _worktrees()
    # a path relative to where the script is started, though each run works in its own tree
    res = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "slice.jsonl", "--pairs", "1"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith(f"trace {trace.resolve()}; HEAD against this tree (")
    # the worktree holds no build, so HEAD runs its sources; this tree runs whatever core it has
    pattern = (r"(kimi-linear-48b-a3b / H200 tp1|llama-3\.1-70b / H100 tp8): HEAD \d+\.\d \([\d,]+ steps, Python\); "
               r"this tree \d+\.\d \([\d,]+ steps, (compiled|Python)\); \d+\.\d\dx \(medians\)")
    assert len(lines) == 3 and all(re.fullmatch(pattern, line) for line in lines[1:]), res.stdout
    assert _worktrees() == before

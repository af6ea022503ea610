"""Output folders and files: poolsim never deletes or overwrites what it did not write (app/output.py)."""

import os

import pandas as pd
import pytest

from poolsim.app.output import (
    MARKER,
    OutputError,
    OutputLock,
    check_out_dir,
    check_out_file,
    publish_dir,
    read_run,
    write_file,
    write_run,
)

STEPS = pd.DataFrame({"step": [0, 1]})
REQUESTS = pd.DataFrame({"rid": [0]})


def write(out, summary=None, extra=None):
    return write_run(out, STEPS, REQUESTS, summary or {"n": 1}, {"model": "m"}, extra=extra)


def user_folder(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.txt").write_text("years of work")
    return d


def test_a_folder_poolsim_did_not_write_is_refused_and_kept(tmp_path):
    d = user_folder(tmp_path)
    with pytest.raises(OutputError, match="not written by poolsim"):
        write(d)
    assert (d / "thesis.txt").read_text() == "years of work" and os.listdir(d) == ["thesis.txt"]
    assert sorted(os.listdir(tmp_path)) == ["mine"]  # no temporary sibling left behind


def test_the_current_directory_and_an_existing_file_are_refused(tmp_path, monkeypatch):
    user_folder(tmp_path)
    monkeypatch.chdir(tmp_path / "mine")
    for out in (".", "", str(tmp_path)):
        with pytest.raises(OutputError, match="current directory"):
            check_out_dir(out)
    with pytest.raises(OutputError, match="exists and is not a folder"):
        check_out_dir("thesis.txt")
    with pytest.raises(OutputError, match="thesis.txt is not a folder"):
        check_out_dir("thesis.txt/run")
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "years of work"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_parent_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(OutputError, match="permission denied"):
        check_out_dir(ro / "run")


def test_a_previous_run_is_replaced_whole_and_said_so(tmp_path):
    out = tmp_path / "run"
    assert check_out_dir(out) == "new"
    write(out, {"n": 1}, extra=lambda d: (d / "report.html").write_text("old page"))
    assert check_out_dir(out) == "previous run"
    write(out, {"n": 2})
    assert read_run(out)[2] == {"n": 2} and not (out / "report.html").exists()
    assert sorted(os.listdir(tmp_path)) == ["run"]  # the old folder, moved aside, is gone too
    assert (out / MARKER).read_text().splitlines()[1:] == ["requests.csv", "run.json", "steps.csv", "summary.json"]


def test_an_empty_folder_is_used(tmp_path):
    (tmp_path / "empty").mkdir()
    assert check_out_dir(tmp_path / "empty") == "empty"
    write(tmp_path / "empty")
    assert read_run(tmp_path / "empty")[2] == {"n": 1}


def test_a_run_folder_holding_a_users_file_is_not_replaced(tmp_path):
    out = tmp_path / "run"
    write(out)
    (out / "notes.txt").write_text("why this config")
    with pytest.raises(OutputError, match=r"holds files poolsim did not write \(notes.txt\)"):
        write(out)
    assert (out / "notes.txt").read_text() == "why this config"


def test_a_failed_write_leaves_the_previous_run_and_no_temporary_folder(tmp_path):
    out = tmp_path / "run"
    write(out, {"n": 1})

    def interrupted(d):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write(out, {"n": 2}, extra=interrupted)
    assert read_run(out)[2] == {"n": 1} and sorted(os.listdir(tmp_path)) == ["run"]


def test_a_second_writer_on_the_same_folder_gets_a_clear_error(tmp_path):
    out = tmp_path / "run"
    with publish_dir(out) as tmp:
        (tmp / "a.txt").write_text("first")
        with pytest.raises(OutputError, match="another poolsim run is writing this folder"):
            write(out)
    assert sorted(os.listdir(out)) == [MARKER, "a.txt"]  # the first writer's folder, not a mix
    with OutputLock(out):  # the lock is free again, and its file is gone once released
        pass
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_a_file_with_the_lock_files_name_but_content_is_not_poolsims_and_stays(tmp_path):
    out = tmp_path / "run"
    users = tmp_path / ".run.poolsim-lock"
    users.write_text("my notes")
    with publish_dir(out) as tmp:
        (tmp / "a.txt").write_text("x")
    assert users.read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == [".run.poolsim-lock", "run"]


def test_a_killed_runs_temporary_folders_are_cleaned_but_not_a_users(tmp_path):
    stale = tmp_path / ".run-abcd1234"  # what a killed run leaves: marker and half the files
    stale.mkdir()
    (stale / MARKER).write_text("")
    (stale / "steps.csv").write_text("step\n")
    (tmp_path / ".run-k1ll3d00").mkdir()  # killed right after mkdtemp
    users = tmp_path / ".run-userdata"
    users.mkdir()
    (users / "keep.txt").write_text("mine")
    write(tmp_path / "run")
    assert sorted(os.listdir(tmp_path)) == [".run-userdata", "run"]
    assert (users / "keep.txt").read_text() == "mine"


def test_a_file_is_replaced_only_if_poolsim_wrote_it_or_with_force(tmp_path):
    path = tmp_path / "plot.png"
    path.write_text("a user's file")
    with pytest.raises(OutputError, match="exists and was not written by poolsim; add --force"):
        write_file(path, lambda tmp: tmp.write_text("new"))
    assert path.read_text() == "a user's file"
    write_file(path, lambda tmp: tmp.write_text("ours"), ours=lambda p: False, force=True)
    assert path.read_text() == "ours"
    write_file(path, lambda tmp: tmp.write_text("again"), ours=lambda p: p.read_text() == "ours")
    assert path.read_text() == "again" and sorted(os.listdir(tmp_path)) == ["plot.png"]
    with pytest.raises(OutputError, match="is a folder"):
        check_out_file(tmp_path)

"""``poolsim report DIR [--compare OTHER_DIR] [--out DIR]``."""

from typer.testing import CliRunner

from poolsim.cli import app

runner = CliRunner()


def test_report_rerenders_into_the_run_folder(run_dirs, tmp_path):
    import shutil

    run_dir = shutil.copytree(run_dirs["fits"], tmp_path / "fits")
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(run_dir / "report.html")
    assert (run_dir / "figures" / "memory_timeline.png").exists() and (run_dir / "summary.csv").exists()


def test_report_out_and_compare(run_dirs, tmp_path):
    result = runner.invoke(app, ["report", str(run_dirs["fits"]), "--out", str(tmp_path / "page")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "page" / "report.html").exists()
    result = runner.invoke(app, ["report", str(run_dirs["fits"]), "--compare", str(run_dirs["aborts"]),
                                 "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "cmp" / "comparison.html")


def test_a_bad_folder_is_one_line_and_nonzero(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "steps.csv").write_text("step\n")
    result = runner.invoke(app, ["report", str(tmp_path / "half")])
    assert result.exit_code == 2
    assert result.output == (f"error: {tmp_path / 'half'}: not a poolsim run folder "
                             "(missing requests.csv, summary.json, run.json)\n")

"""Every option and argument of every command has one line of help (issue #11: flags with no description)."""

import typer.main

from poolsim.cli import app


def _commands(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), cmd


def test_every_parameter_has_help():
    missing = [f"{path} {'/'.join(p.opts)}" for path, cmd in _commands(typer.main.get_command(app))
               for p in cmd.params if not (getattr(p, "help", None) or "").strip()]
    assert missing == []


def test_the_cli_runs_openblas_on_one_thread_unless_told_otherwise():
    """poolsim calls no BLAS routine: its CLI starts numpy with one OpenBLAS thread (idle workers spin ~0.1 CPU s),
    and a value the user set stays."""
    import os
    import subprocess
    import sys

    probe = "import cli, numpy, os; print(os.environ['OPENBLAS_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OPENBLAS_NUM_THREADS": "4"}, cwd=root,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"


def test_every_commands_help_keeps_bracketed_text_and_shows_flags_as_switches():
    import click
    from typer.main import get_command
    from typer.testing import CliRunner

    from poolsim.cli import app

    root = get_command(app)
    runner = CliRunner()

    def commands(group, path):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from commands(cmd, [*path, name])
            else:
                yield [*path, name], cmd

    checked = 0
    for path, cmd in commands(root, []):
        out = runner.invoke(app, [*path, "--help"], terminal_width=400).output
        assert "<bool>" not in out and "BOOLEAN" not in out, path  # a switch takes no value: no `--quiet true`
        flat = " ".join(out.split())
        for param in cmd.params:
            text = " ".join((getattr(param, "help", None) or "").split())
            if "[" in text:
                assert text in flat, (path, param.name)  # no markup renderer ate "[ray]" or "[max(L*r,1), L]"
                checked += 1
    assert checked >= 2  # --ray and --random-range-style hold brackets: the check above ran

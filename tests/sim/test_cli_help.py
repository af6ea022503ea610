"""Every option and argument of every command has one line of help (issue #11: flags with no description)."""

import typer.main

from cli import app


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

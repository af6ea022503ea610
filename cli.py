"""poolsim command line: a thin typer layer over the library (trace -> sim -> pools -> metrics -> report)."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Capacity planner for LLM-serving memory: SGLang's pools, radix cache and scheduler, simulated.")


@app.command()
def version() -> None:
    """Print the poolsim version."""
    from importlib.metadata import version as _v

    typer.echo(_v("poolsim"))


if __name__ == "__main__":
    app()

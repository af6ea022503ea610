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


@app.command()
def report(
    run_dir: str = typer.Argument(..., metavar="DIR", help="A run folder written by `poolsim run --out DIR`."),
    compare: list[str] = typer.Option([], "--compare", metavar="OTHER_DIR",
                                      help="Another run folder to compare with (repeatable)."),
    out: str | None = typer.Option(None, "--out", metavar="DIR", help="Where to write the page (default: DIR)."),
) -> None:
    """Re-render a run's HTML report (and PNGs) from its saved data; with --compare, a side-by-side page."""
    from reports.html import ReportError, render_comparison, render_report

    try:
        page = (render_comparison([run_dir, *compare], out or run_dir) if compare
                else render_report(run_dir, out))
    except ReportError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(str(page))


if __name__ == "__main__":
    app()

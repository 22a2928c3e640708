"""The `primectl` command line: parse options, call one function, map errors to exit codes.

Exit codes: 0 success, 1 deployment failure, 2 bad input. Heavy modules are
imported inside the commands so `primectl --help` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from primectl.errors import EXIT_BAD_INPUT, EXIT_FAILURE, DeployError, RecipeError

if TYPE_CHECKING:
    from primectl.plan.model import Plan
    from primectl.recipe.load import LoadedRecipe

app = typer.Typer(
    help="Deploy disaggregated LLM serving (Dynamo + vLLM/mocker + NIXL + Mooncake) from a recipe.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)

T = TypeVar("T")


class Output(str, Enum):
    """Output formats."""

    table = "table"
    json = "json"


RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json.")]


def _guard(fn: Callable[[], T]) -> T:
    """Run a command body; print errors the way operators need them and exit with the right code."""
    from rich.console import Console

    err = Console(stderr=True)
    try:
        return fn()
    except RecipeError as exc:
        n = len(exc.problems)
        err.print(f"[bold red]error:[/] {n} problem{'s' if n != 1 else ''} in the recipe; nothing was changed")
        for p in exc.problems:
            err.print(f"  {p}", markup=False, highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except DeployError as exc:
        err.print(f"[bold red]failed:[/] {exc}", highlight=False)
        if exc.log_tail:
            err.print(f"--- last lines of {exc.service}'s log ---", highlight=False)
            err.print(exc.log_tail, markup=False, highlight=False)
        raise typer.Exit(EXIT_FAILURE) from None


def load(path: Path) -> LoadedRecipe:
    """Load and fully validate a recipe (RecipeError on any problem)."""
    from primectl.recipe.load import load_recipe

    return load_recipe(path)


def load_plan(path: Path) -> tuple[LoadedRecipe, Plan]:
    """Validate a recipe and plan it."""
    from primectl.plan.build import build_plan

    loaded = load(path)
    return loaded, build_plan(loaded.recipe)


@app.command()
def validate(recipe: RecipeArg) -> None:
    """Check a recipe: schema, GPU accounting, memory fit, KV formats, versions, engine flags."""

    def body() -> None:
        _, plan = load_plan(recipe)
        typer.echo(f"{recipe}: valid ({len(plan.services)} services on {len({s.host for s in plan.services})} hosts)")

    _guard(body)


@app.command()
def plan(recipe: RecipeArg, output: OutputOpt = Output.table) -> None:
    """Show what would run where: placement, capacity and the defaults the recipe left out."""

    def body() -> None:
        _, p = load_plan(recipe)
        if output is Output.json:
            sys.stdout.write(p.model_dump_json(indent=2) + "\n")
            return
        from primectl.report import print_plan

        print_plan(p)

    _guard(body)


@app.command()
def render(
    recipe: RecipeArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the per-host bundles.")] = Path("out"),
) -> None:
    """Write per-host bundles (run scripts, systemd units, configs, manifest) to a directory."""

    def body() -> None:
        from primectl.render.bundle import render_plan, write_bundles

        loaded, p = load_plan(recipe)
        bundles = render_plan(p, generate_model=bool(loaded.recipe.model.generate),
                              max_context=loaded.recipe.model.max_context or 32768)
        written = write_bundles(bundles, out)
        for host, b in sorted(bundles.items()):
            typer.echo(f"{out / host}: revision {b.revision}, {len(b.manifest['services'])} services")  # type: ignore[arg-type]
        typer.echo(f"{len(written)} files written")

    _guard(body)


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editors: yaml-language-server)."""
    import json

    from primectl.recipe.model import Recipe

    doc = Recipe.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "primectl recipe"
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

"""Typer's private surface: the click it vendors (`typer._click`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import click.exceptions
    import typer._click.exceptions


def usage_error() -> type[typer._click.exceptions.UsageError] | type[click.exceptions.UsageError]:
    """Click's UsageError, wherever this Typer version keeps click.

    A Typer that vendors click (`typer._click`) raises its own copy even when a separate
    click is installed beside it (mutmut and import-linter bring one): that copy comes first.
    """
    try:
        from typer._click.exceptions import UsageError as vendored
    except ImportError:
        from click.exceptions import UsageError

        return UsageError
    return vendored

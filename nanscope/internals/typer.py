"""Typer's private surface: the click it vendors (`typer._click`)."""


def usage_error():
    """Click's UsageError, wherever this Typer version keeps click.

    A Typer that vendors click (`typer._click`) raises its own copy even when a separate
    click is installed beside it (mutmut and import-linter bring one): that copy comes first.
    """
    try:
        from typer._click.exceptions import UsageError
    except ImportError:
        from click.exceptions import UsageError
    return UsageError

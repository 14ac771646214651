"""`python -m nanscope` runs the CLI."""

from nanscope.cli import main

main()

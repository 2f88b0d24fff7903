"""`python -m runner.cli`, as the console script."""

from runner.cli import main

main()

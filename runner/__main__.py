"""``python -m runner``: the ``runner`` command (runner.cli), for a venv whose scripts are
not on PATH."""

from runner.cli import main

if __name__ == "__main__":
    main()

"""``python -m memable``: the command line."""

from ._cli import main

main()

"""``python -m memable``: the command line."""

from ._cli.commands import main

main()

"""``python -m hpcpipe`` is the ``hpcpipe`` command."""

from hpcpipe.cli.app import main

main()

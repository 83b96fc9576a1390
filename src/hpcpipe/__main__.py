"""``python -m hpcpipe`` is the ``hpcpipe`` command."""

from hpcpipe.cli.app import command

# Guarded: a worker forked from the agent's fork server imports this module as ``__mp_main__``.
if __name__ == "__main__":
    command()

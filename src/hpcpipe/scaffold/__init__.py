"""``hpcpipe new recipe NAME``: an installable package with a working recipe to start from."""

"""An hpcpipe recipe from outside hpcpipe: classify snippets of Python source by stdlib package."""

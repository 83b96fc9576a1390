"""The `hpcpipe` command line: one module per verb group; each parses, calls the library, prints."""

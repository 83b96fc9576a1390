"""Evaluation of trained models: function-calling generation and a BFCL-rule AST checker."""

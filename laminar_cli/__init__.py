"""The `laminar` command."""

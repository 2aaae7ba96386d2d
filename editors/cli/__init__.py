"""The `specedit` command line."""

"""The command shells: argument parsing and rendering over the library, one module per command."""

"""Where settings come from: the project configuration and the one resolver every entry point uses."""

"""The bodies of the CLI commands: each takes parsed values and prints its output."""

"""The ``ember`` command line and its subcommands."""

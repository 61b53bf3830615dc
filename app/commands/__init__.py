"""One module per `qwenlocal` subcommand."""

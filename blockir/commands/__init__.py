"""One module per `blockir` subcommand; each defines register(subparsers)."""

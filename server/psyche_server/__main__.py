"""`python -m psyche_server` = the `psyche-server` command."""

from psyche_server.cli import main

main()

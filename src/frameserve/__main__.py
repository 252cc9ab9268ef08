"""``python -m frameserve`` runs the command line."""

from frameserve.cli import main

main()

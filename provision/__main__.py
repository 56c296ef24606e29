"""`python -m provision` runs the lockctl CLI."""

from provision.cli import main

main()

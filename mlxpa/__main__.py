"""`python -m mlxpa` entry point."""
from mlxpa.cli import main

main()

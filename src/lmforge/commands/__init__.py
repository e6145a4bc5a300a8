"""Implementations of the ``lmforge`` commands; ``lmforge.cli`` holds the table that names them."""

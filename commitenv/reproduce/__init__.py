"""Reproductions of the papers' tables (``commitenv reproduce NAME``)."""

"""Generators of docs/: the references and the performance page."""

"""Execution backends for running verl where it has no built-in support (see rpg.backends.cpu)."""

"""Shared leaves: the run directory, rank states, errors, hostlists, config search path, text tables.

Everything else may import these; they import nothing from hpc_train outside ``core`` (and no torch).
"""

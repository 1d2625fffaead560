"""What users run by hand, on top of everything else: job status and logs, the notebook API, plots, scaling
studies, cluster profiles and the CLI's help.

The paths users type (``python -m hpc_train.jobs``, ``from hpc_train.api import submit``, ...) are kept as
aliases at the top of the package.
"""

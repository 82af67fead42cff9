"""The shipped configs as the package ``lit_dof.configs`` of an installed wheel (see :mod:`lit_dof.config_files`).

Nothing to import: this file makes the directory a regular package so that ``importlib.resources`` returns it as
a plain directory.
"""

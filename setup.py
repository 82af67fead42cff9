"""Package list for setuptools; everything else (metadata, dependencies, package data) is in pyproject.toml.

The wheel ships the repository's ``configs/`` directory as the package ``lit_dof.configs`` (read through
:mod:`lit_dof.config_files`) without moving it: ``package_dir`` maps the package to the directory. pyproject.toml
cannot add such a mapped package to automatically discovered ones, hence this file.
"""

from setuptools import find_namespace_packages, setup

# Its folders (configs/methods, configs/models/gpt2, ...) are listed as packages too: setuptools ships data files
# only from listed packages, and warns that it will stop shipping them otherwise.
CONFIGS = ["lit_dof.configs", *(f"lit_dof.configs.{name}" for name in find_namespace_packages(where="configs"))]

setup(
    packages=[*find_namespace_packages(include=["lit_dof*"]), *CONFIGS],
    package_dir={"lit_dof.configs": "configs"},
)

"""``python -m lit_dof``: the ``lit-dof`` command (:mod:`lit_dof.cli`)."""

from lit_dof.cli import main

main()

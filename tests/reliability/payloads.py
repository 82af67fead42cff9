"""An attacker's pickled object for the tests of what lit-dof loads from disk."""

from __future__ import annotations

import os
from pathlib import Path


class Payload:
    """Unpickled by an unrestricted loader, it calls ``os.mkdir(marker)``: the attacker's code (a test then finds the
    marker folder). Pickled as a reference to the global ``posix.mkdir``.

    Args:
        marker: the folder its code would create.
    """

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)

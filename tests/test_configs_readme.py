"""configs/README.md (issue #44, item 3): a row per shipped recipe, its measured columns re-derived from the
committed records by tools/configs_readme.py — an edit of a record, a recipe or the table that leaves them apart
fails here. The planned-peak column is read back (``lit-dof plan`` per recipe is the tool's slow part)."""

from __future__ import annotations

import importlib.util
import sys

from lit_dof.config_files import shipped_configs
from tests.conftest import REPO


def tool():
    spec = importlib.util.spec_from_file_location("configs_readme", REPO / "tools" / "configs_readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_recipe_has_a_row_and_the_measured_columns_match_the_records():
    module = tool()
    text = (REPO / "configs" / "README.md").read_text()
    recipes = [n for n in shipped_configs() if not n.startswith(module.BUILDING_BLOCKS)]
    assert recipes and all(f"| `{name}` |" in text for name in recipes)
    assert all(line in text.splitlines() for line in module.table(plan=False)), "run python tools/configs_readme.py"
    quickstart = next(line for line in text.splitlines() if line.startswith("| `quickstart` |"))
    cells = [c.strip() for c in quickstart.split("|")[1:-1]]
    assert cells[2].endswith(" min") and cells[3].endswith(" GiB") and cells[4].endswith(" ×")  # all measured
    assert "test split, 3 fits" in cells[6]

"""Editable installs of the `icl_zoo_export` import package, whose source folder is `export/`.

A wheel gets it by force-include (pyproject.toml); hatchling's dev mode cannot rename a folder, so an
editable install gets a one-file module `icl_zoo_export.py` that loads `export/` in its place."""

import os

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

LOADER = '''\
"""Editable install of icl-zoo: `icl_zoo_export` is the source tree's `export/` folder."""
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location(__name__, {init!r}, submodule_search_locations=[{folder!r}])
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
'''


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if version != "editable":
            return
        folder = os.path.join(self.root, "export")
        loader = os.path.join(self.directory, "icl_zoo_export.py")
        os.makedirs(self.directory, exist_ok=True)
        with open(loader, "w", encoding="utf-8") as f:
            f.write(LOADER.format(init=os.path.join(folder, "__init__.py"), folder=folder))
        build_data["force_include_editable"][loader] = "icl_zoo_export.py"

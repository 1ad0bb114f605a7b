"""The files a run writes from its summary, one module per format (see registry.py). Importing this package imports
every module in it, which registers them: a new format is one new module, nothing else to edit."""

import importlib
import pkgutil

from kvplan.bench.outputs.registry import OUTPUTS, write_reports

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["OUTPUTS", "write_reports"]

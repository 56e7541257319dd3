"""The data that ships with specsim, installed with the package.

``specsim.data.models`` is the repository's ``models/`` folder (model and hardware catalogue,
calibrations, validation runs) and ``specsim.data.traces`` its ``traces/`` folder (example
traces, prompt sets, the Collect-2-Query proxy measurement). ``specsim.shipped`` finds files in
both; nothing else should know where they lie.
"""

from pathlib import Path as _Path

# Run from a source checkout without installing (``PYTHONPATH=.``), the two folders are found
# where the checkout keeps them; installed (a wheel, an editable install), they are packages.
_checkout = _Path(__file__).resolve().parents[2]
if (_checkout / "pyproject.toml").is_file() and (_checkout / "models" / "__init__.py").is_file():
    __path__.append(str(_checkout))

"""The data that ships with specsim, installed with the package.

``specsim.data.models`` is the repository's ``models/`` folder (model and hardware catalogue,
calibrations, validation runs) and ``specsim.data.traces`` its ``traces/`` folder (example
traces, prompt sets, the Collect-2-Query proxy measurement). ``specsim.shipped`` finds files in
both; nothing else should know where they lie.
"""

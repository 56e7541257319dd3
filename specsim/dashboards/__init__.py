"""Interactive dashboards: one self-contained HTML page (plotly.js inline, works offline)
with the (k, s) throughput heatmap, speedup vs k, the iteration-time breakdown, acceptance
from the trace, the batch × context regime map and measured vs predicted times.

- :mod:`~specsim.dashboards.data`: figure data, pure functions returning dictionaries;
- :mod:`~specsim.dashboards.figures`: plotly figure builders;
- :mod:`~specsim.dashboards.page`: HTML assembly, controls, atomic write;
- :mod:`~specsim.dashboards.validation`: measured-vs-predicted input readers (pluggable);
- :mod:`~specsim.dashboards.build`: predicts every combination the controls offer.
"""
from specsim.dashboards.build import Dashboard, DashboardOptions, Validation, build_dashboard

__all__ = ["Dashboard", "DashboardOptions", "Validation", "build_dashboard"]

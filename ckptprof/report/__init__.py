"""``ckptprof report``: read traces and results, show where restore time went.

Pipeline, one module per step::

    data = load(paths)          # load.py: files -> records
    report = aggregate(data)    # aggregate.py: groups, medians (+ hints.py): breakdown.py's rows
    print(render_text(report))  # text.py; render_json (json_out.py); write_plot (plot.py)
"""

import importlib

#: the package's API, imported on first use (a callback that only needs the goodput
#: module at a resume does not pay for the whole report)
_EXPORTS = {
    "Report": "aggregate",
    "aggregate": "aggregate",
    "render_json": "json_out",
    "ReportData": "load",
    "load": "load",
    "write_plot": "plot",
    "render_text": "text",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ckptprof.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ckptprof.report.{_EXPORTS[name]}"), name)


__all__ = ["Report", "ReportData", "aggregate", "load", "render_json", "render_text", "write_plot"]

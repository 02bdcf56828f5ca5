"""``ckptprof report``: read traces and results, show where restore time went.

Pipeline, one module per step::

    data = load(paths)          # load.py (traces.py, json_files.py): files -> records.py
    report = aggregate(data)    # aggregate.py: groups.py, sweep.py (+ hints*.py): breakdown.py
    print(render_text(report))  # text.py; render_json (json_out.py); write_plot (plot.py)
"""

from ckptprof.report.aggregate import Report, aggregate
from ckptprof.report.json_out import render_json
from ckptprof.report.load import ReportData, load
from ckptprof.report.plot import write_plot
from ckptprof.report.text import render_text

__all__ = ["Report", "ReportData", "aggregate", "load", "render_json", "render_text", "write_plot"]

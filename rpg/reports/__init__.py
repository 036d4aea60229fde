"""Reports from run logs: the paper's tables (3, 5, 6, 7, 8) and the training-dynamics figure.

CLI: ``python scripts/report_tables.py`` and ``python scripts/plot_curves.py`` (see
docs/data-and-reports.md). Published numbers: ``published.csv`` in this package (spec §7).
"""

"""Reports from run logs: the paper's tables (3, 5, 6, 7, 8) and the training-dynamics figure.

CLI: ``python -m rpg.reports tables ...`` and ``python -m rpg.reports curves ...`` (see
docs/data-and-reports.md; ``scripts/report_tables.py`` and ``scripts/plot_curves.py`` are the same). Published numbers: ``published.csv`` in this package (the paper's Tables 3, 5-8).
"""

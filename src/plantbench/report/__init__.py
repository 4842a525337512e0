"""The study report (``plantbench report``): report/build.py assembles the sections (sections.py)
of tables (tables.py) and figures (figures.py) into report.md and report.html (html.py)."""

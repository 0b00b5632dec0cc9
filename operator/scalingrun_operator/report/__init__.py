"""Reports for people: a run's training curves (run.py) and a sweep's scaling (sweep.py), as PNG and Markdown
from the progress documents or the sweep's rows; and the sweep's table on a terminal."""

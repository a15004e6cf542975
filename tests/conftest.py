import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

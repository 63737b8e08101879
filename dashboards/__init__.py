"""Grafana dashboards for teye, as code (grafana-foundation-sdk), and `teye dashboards push`.

The generated JSON lives in dashboards/json/ (regenerate with
``python -m dashboards.generate``); ``dashboards.push`` uploads it.
"""

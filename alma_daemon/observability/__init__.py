"""What a person watches: the Prometheus metrics (one registry) and their exporter, the results log
of a run (``results.json``, ``series.csv``), and the reports and figures drawn from any run folder.
"""

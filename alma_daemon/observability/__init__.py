"""What a person watches: the exporter of the Prometheus metrics (their one registry is
:mod:`alma_daemon.metrics`, below the layers that update it), the results log of a run
(``results.json``, ``series.csv``), and the reports and figures drawn from any run folder.
"""

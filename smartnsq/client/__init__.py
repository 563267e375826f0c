"""What the Producer and the Consumer share on the API floor: the options both take
(``options.py``), OpenTelemetry spans and metrics (``telemetry.py``) and the client-side
trace log (``tracelog.py``)."""

"""Storage monitor: scheduled latency probes of a store, kept as a bounded local time series.

`probes` runs one round (empty and small object, PUT then GET, each on a fresh connection);
`series` appends rounds to a JSON-lines file that never grows past its byte limit, reads it
back and finds level shifts; ``pegasus-cloudio monitor`` (`cli`) is the command a cron job or
systemd timer runs; ``pegasus-cloudio bench report --monitor FILE`` plots the series.
"""

"""The web dashboard: plain ES modules and CSS served by the coordinator at ``/`` (no build
step), and the aggregations its charts read (``charts``)."""

"""Alerting as commands see it: Alertmanager's API (what fires, silences), `primectl alerts` and `status`'s marks,
and the silences a change sets (quiet.py). The configuration Prometheus and Alertmanager run with is
primectl/monitoring/."""

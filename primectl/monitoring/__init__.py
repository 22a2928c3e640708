"""Monitoring: Prometheus, Alertmanager and the exporters a recipe's `monitoring:` block turns on.

model.py holds the block; scrape.py turns the Plan's services into Prometheus's scrape configuration; rules.py
holds the alert rules and their runbook lines; alertmanager.py the routes; the component that plans the services
is primectl/components/monitoring.py.
"""

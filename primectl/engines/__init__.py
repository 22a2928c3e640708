"""Engine adapters: the only modules that know a component's command line.

Each module maps the relevant part of the recipe to argv, env and a readiness
probe for one component at its pinned version (launch-reference.md).
"""

"""Engine adapters: the only modules that know a component's command line.

Each module maps the relevant part of the recipe to argv, env and a readiness
probe for one component at its pinned version (docs/version-set.md). The flags
each pinned component accepts are in docs/flag-catalog.md; how the processes
behaved when run is in docs/runtime-notes.md.
"""

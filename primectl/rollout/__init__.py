"""The live-change strategy: how a change rolls through a running deployment, decided without touching a machine.

`strategy.py` decides (generations, surge, batches, reloads, drain order, what a rollback puts back) from the
Plan, the diff's changes and what the machines recorded; `expected.py` says what each decision costs clients,
for `diff` and `up --dry-run`. A deploying target carries the decisions out.
"""

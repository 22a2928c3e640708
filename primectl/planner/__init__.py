"""Recipe file -> Plan: the stage that asks the engines and targets, so that the Plan stays plain data.

`load` reads a recipe file into a validated Recipe (the engines add their blocks and pins to its model),
`rules` checks what the schema cannot say (asking the engine for its own rules), `placement` binds worker
slots to hosts and GPUs, `build` assembles the Plan (the engines' services, the target's hosts) and
`report` prints it for `primectl plan`. `primectl.plan` holds the Plan's model only, which engines,
targets, render, deploy and checks import without importing the planner.
"""

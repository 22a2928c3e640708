"""`primectl bench` and `primectl ab`: agentic benchmarks driven by AIPerf 0.13.0.

primectl never generates load itself. It writes the workload as an AIPerf
input file (mooncake_trace JSONL with per-block hash_ids), runs `aiperf
profile` against the deployment's endpoint, and turns AIPerf's exports plus
the frontend's /metrics into one validated `summary.json` per run.

Modules: `workload` (pure, seeded session generator), `sla` (SLA parser and
knee search), `summary` (AIPerf exports -> summary, validity gate),
`aiperf` (finding and running the executable), `runner` (bench and knee
orchestration), `ab` (the paired A/B trial), `plots` (matplotlib PNGs).
"""

"""The alert rules primectl ships, each with a severity, a summary and a runbook line saying what to do.

The groups are plain data; `rules_yaml` is the rule file bare-metal Prometheus loads, and the Kubernetes target's
PrometheusRule carries the same groups. Expressions read only the labels scrape.py gives every target
(`deployment`, `service`, `host`, `role`, and `job` = the component) and the metric names the real components
export: tests/test_metric_contract.py checks each name against exposition captured from them
(tests/data/metrics/, by scripts/capture_metrics.py). A rule is emitted only when what feeds it is planned
(`RuleFacts.components`, `roles`, `workers`), so a deployment carries no rule that can never have data; each
exporter field a rule relies on has a guard that fires when the field is missing from a target that is up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from primectl.monitoring.model import Slo, duration_s
from primectl.yamltext import safe_dump

# Client-caused request errors (Dynamo's `error_type`): not the deployment's failures, so not in the error ratio.
# `not_found` is left out too: a model the frontend lost shows as WorkersBelowPlan / GateNotReady instead, while
# every `primectl smoke` asks for a model that does not exist.
CLIENT_ERRORS = "validation|not_found|cancelled"
# Fewer requests than this in the window and an error ratio says nothing (1% of 100 is one request).
MIN_REQUESTS_FOR_RATIO = 100
# Peers a worker is compared with for the gray-failure rule: below 3 a median cannot single one out.
MIN_PEERS = 3
# The labels every scrape target carries; guards and per-target aggregations keep them.
TARGET = "deployment, job, service, host, role"
# A fleet's gateway replicas (primectl/fleet/gateway/): their scrape job, and the label their series name the
# fleet's deployment by (the replica's own `deployment` label, which Prometheus renames beside the target's).
GATEWAY_JOB = "fleet-gateway"
MEMBER = "exported_deployment"
# Requests moved off a worker mid-flight: the alert, and the window it counts them over (a change that drains
# workers silences it for that long after it ends: alerting/quiet.py).
MIGRATIONS_RISING = "MigrationsRising"
MIGRATION_WINDOW_S = 300
# The readiness gate's alerts (the health loop's primectl_gate_ready): a change of what serves silences them.
GATE_NOT_READY, GATE_CHECK_MISSING = "GateNotReady", "GateCheckMissing"

# Worker components whose /metrics carry Dynamo's KV-usage gauge and the engine's counters the quality rules read
# (as captured: tests/data/metrics/<component>.prom; the mocker exports neither).
KV_USAGE_WORKERS = ("dynamo-vllm",)
ENGINE_COUNTERS = {"dynamo-vllm": {"preemptions": "vllm:num_preemptions_total",
                                   "kv_transfer_failures": "vllm:nixl_num_failed_transfers_total"}}

# The DCGM fields the hardware rules read; dcgm.FIELDS, the counters file dcgm-exporter collects, holds each of
# them. dcgm-exporter names each metric after the field as written, so these names are the metric names.
DCGM_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS",
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
)
# Those only a multi-node NVLink domain has (NVLink5 links, IMEX).
NVLINK_DOMAIN_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",
    "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
    "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER_FLOAT",
    "DCGM_FI_IMEX_DAEMON_STATUS",
)


@dataclass(frozen=True)
class RuleFacts:
    """What the rules need to know of the plan."""

    deployment: str
    slo: Slo
    scrape_interval: str = "5s"
    workers: dict[str, int] = field(default_factory=dict)  # role -> planned worker processes
    roles: tuple[str, ...] = ()  # every role with a scraped service
    components: tuple[str, ...] = ()  # every component with a scraped service (the scrape jobs)
    health_interval: str = "15s"  # how often each host's health loop rewrites its textfile metrics
    infiniband: bool = False  # the hosts have InfiniBand ports (node_exporter's infiniband collector has data)
    nvlink_domain: bool = False  # GPUs share a multi-node NVLink domain (GB200/GB300 NVL72): NVLink5, IMEX
    gateway_replicas: int = 0  # a fleet's gateway tier: its planned replicas


@dataclass(frozen=True)
class Rule:
    """One alerting rule."""

    alert: str
    expr: str
    severity: str  # critical pages; warning tickets; none (the Watchdog)
    summary: str
    runbook: str
    for_: str = "0s"
    labels: dict[str, str] = field(default_factory=dict)

    def doc(self, deployment: str) -> dict[str, Any]:
        """The rule as Prometheus reads it; every alert carries the deployment, aggregations included."""
        out: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.for_ != "0s":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, "deployment": deployment, **self.labels}
        out["annotations"] = {"summary": self.summary, "runbook": self.runbook}
        return out


def _times(duration: str, n: float) -> str:
    """`n` times a duration, in seconds."""
    return f"{round(duration_s(duration) * n)}s"


def _sel(facts: RuleFacts, **matchers: str) -> str:
    """A label selector body: the deployment, then `matchers`; a value may start with the operator
    (`role="!auxiliary"` -> role!="auxiliary"; `~` and `!~` for regular expressions)."""
    out = [f'deployment="{facts.deployment}"']
    for name, value in matchers.items():
        op = next((o for o in ("!~", "~", "!") if value.startswith(o)), "")
        out.append(f'{name}{ {"!~": "!~", "~": "=~", "!": "!=", "": "="}[op]}"{value[len(op):]}"')
    return ",".join(out)


def _has(facts: RuleFacts, *components: str) -> bool:
    return any(c in facts.components for c in components)


def target_down_for(facts: RuleFacts) -> str:
    """How long a target stays down before TargetDown fires: three scrapes, so one or two failed scrapes (a
    blip) never fire, and with 2 s scrapes and evaluations a SIGKILL fires within about 12 s."""
    return _times(facts.scrape_interval, 3)


def availability(facts: RuleFacts) -> list[Rule]:
    """Processes the deployment needs, down or missing, and the readiness gate."""
    down = target_down_for(facts)
    # a gateway replica down is GatewayReplicaDown's (the edge routes around it)
    serving = "!~auxiliary|gateway" if facts.gateway_replicas else "!auxiliary"
    out = [
        Rule("TargetDown", f"up{{{_sel(facts, role=serving)}}} == 0", "critical",
             "{{ $labels.service }} on {{ $labels.host }} ({{ $labels.role }}) is not answering its metrics scrape",
             "primectl status <recipe>; primectl logs <recipe> {{ $labels.service }}; primectl up <recipe> restarts it",
             for_=down),
        Rule("TargetDown", f"up{{{_sel(facts, role='auxiliary')}}} == 0", "warning",
             "{{ $labels.service }} on {{ $labels.host }} (monitoring) is not answering its metrics scrape: the "
             "alerts that read it cannot fire",
             "primectl status <recipe>; primectl logs <recipe> {{ $labels.service }}; primectl up <recipe> restarts it",
             for_=down),
    ]
    for role, count in sorted(facts.workers.items()):
        live = f"up{{{_sel(facts, role=role)}}} == 1"
        out.append(Rule(
            "WorkersBelowPlan", f"count by (deployment, role) ({live}) < {count} or absent({live})", "critical",
            f"fewer live {role} workers than the plan's {count}",
            "primectl status <recipe> names the missing workers; primectl up <recipe> starts them",
            for_=down, labels={"role": role}))
    if _has(facts, "node-exporter"):  # the monitoring host's health loop writes the gate through node_exporter
        health = facts.health_interval
        out += [
            Rule(GATE_NOT_READY, f"primectl_gate_ready{{{_sel(facts)}}} == 0", "critical",
                 "the deployment's readiness gate has not answered 200 for two health checks on {{ $labels.host }}",
                 "primectl status <recipe>; primectl smoke <recipe>; primectl logs <recipe> frontend",
                 for_=_times(health, 2)),
            Rule(GATE_CHECK_MISSING,
                 f"absent(primectl_gate_ready{{{_sel(facts)}}}) and on () "
                 f"count(up{{{_sel(facts, job='node-exporter')}}} == 1) > 0", "warning",
                 "no health loop reports the readiness gate, so GateNotReady cannot fire",
                 "primectl status <recipe> (health-<host>); primectl logs <recipe> health-<host>; primectl up <recipe>",
                 for_=_times(health, 3)),
            Rule("HealthCheckFailed", f"primectl_health_check_ok{{{_sel(facts)}}} == 0", "warning",
                 "host check {{ $labels.check }} fails on {{ $labels.check_host }}",
                 "primectl preflight <recipe> says what the check found; fix it on the host",
                 for_=_times(health, 2)),
            Rule("HealthLoopStale",
                 f"time() - primectl_health_check_timestamp_seconds{{{_sel(facts)}}} > {round(duration_s(health) * 3)}",
                 "warning", "the health loop on {{ $labels.host }} has not run for three intervals",
                 "primectl status <recipe> (health-<host>); primectl logs <recipe> health-<host>; primectl up <recipe>"),
        ]
    return out


def quality(facts: RuleFacts) -> list[Rule]:
    """The frontend's view of serving: errors, latency against the SLO, stuck requests, migrations; and the
    workers' KV cache, preemptions and KV transfers where their engine exports them."""
    out: list[Rule] = []
    slo, sel = facts.slo, _sel(facts)
    if _has(facts, "dynamo-frontend"):
        by = "deployment, model"
        requests = f"dynamo_frontend_requests_total{{{sel}}}"
        errors = f"dynamo_frontend_requests_total{{{_sel(facts, status='error', error_type='!~' + CLIENT_ERRORS)}}}"

        def p95(hist: str) -> str:
            return f"histogram_quantile(0.95, sum by ({by}, le) (rate({hist}_bucket{{{sel}}}[5m])))"

        out += [
            Rule("ErrorRatioHigh",
                 f"(sum by ({by}) (rate({errors}[5m])) / sum by ({by}) (rate({requests}[5m]))) > {slo.error_ratio} "
                 f"and sum by ({by}) (increase({requests}[5m])) >= {MIN_REQUESTS_FOR_RATIO}", "critical",
                 f"more than {slo.error_ratio:.2%} of {{{{ $labels.model }}}} requests fail (5 minutes)",
                 "primectl status <recipe>; primectl logs <recipe> frontend; primectl smoke <recipe>", for_="2m"),
            Rule("TimeToFirstTokenHigh", f"{p95('dynamo_frontend_time_to_first_token_seconds')} > {slo.ttft_p95_s}",
                 "warning", f"time to first token p95 of {{{{ $labels.model }}}} is over the SLO's {slo.ttft_p95_s} s",
                 "primectl status <recipe> (queues, KV use); add prefill workers or lower the token budget, then "
                 "primectl up <recipe>", for_="5m"),
            Rule("InterTokenLatencyHigh", f"{p95('dynamo_frontend_inter_token_latency_seconds')} > {slo.itl_p95_s}",
                 "warning", f"inter-token latency p95 of {{{{ $labels.model }}}} is over the SLO's {slo.itl_p95_s} s",
                 "primectl status <recipe> (decode load); add decode workers or lower max_num_seqs, then "
                 "primectl up <recipe>", for_="5m"),
            Rule("RequestsStuck",
                 f"(sum by ({by}) (dynamo_frontend_queued_requests{{{sel}}}) > 0 "
                 f"or sum by ({by}) (dynamo_frontend_inflight_requests{{{sel}}}) > 0) "
                 f"unless on ({by}) sum by ({by}) (rate(dynamo_frontend_output_tokens_total{{{sel}}}[2m])) > 0",
                 "critical", "{{ $labels.model }} has requests in flight but produced no token for 2 minutes",
                 "primectl status <recipe>; primectl logs <recipe> <worker>; primectl restart <recipe> <worker>",
                 for_="2m"),
            Rule(MIGRATIONS_RISING,
                 f"sum by ({by}, migration_type) "
                 f"(increase(dynamo_frontend_model_migration_total{{{sel}}}[{MIGRATION_WINDOW_S // 60}m])) > 0",
                 "warning", "requests of {{ $labels.model }} moved to another worker mid-flight "
                 "({{ $labels.migration_type }}): a worker failed under them",
                 "primectl status <recipe>; primectl logs <recipe> <worker> around the time"),
        ]
    if _has(facts, *KV_USAGE_WORKERS):
        out.append(Rule(
            "KvCacheNearlyFull",
            f"max by ({TARGET}) (dynamo_component_gpu_cache_usage_percent{{{sel}}}) > 0.95", "warning",
            "{{ $labels.service }}'s KV cache is over 95% full: requests queue or are preempted",
            "primectl status <recipe> (KV use per worker); add workers of the role or lower max_num_seqs",
            for_="5m"))
    for component, names in sorted(ENGINE_COUNTERS.items()):
        if not _has(facts, component):
            continue
        out.append(Rule(
            "PreemptionsRising",
            f"sum by ({TARGET}) (increase({names['preemptions']}{{{_sel(facts, job=component)}}}[5m])) > 0",
            "warning", "{{ $labels.service }} keeps preempting requests (KV cache exhausted)",
            "primectl status <recipe> (KV use); lower max_num_seqs or add workers of the role", for_="5m"))
        if "prefill" in facts.roles:  # KV moves from prefill to decode workers only when they are separate
            out.append(Rule(
                "KvTransfersFailing",
                f"sum by ({TARGET}) (increase({names['kv_transfer_failures']}{{{_sel(facts, job=component)}}}[5m])) > 0",
                "warning", "KV transfers of {{ $labels.service }} fail (prefill to decode)",
                "primectl preflight <recipe> runs the transfer probe; primectl logs <recipe> {{ $labels.service }}"))
    return out


def gray_failure(facts: RuleFacts) -> list[Rule]:
    """One worker far slower than its peers while nothing is down: its recent inter-token latency (the frontend's
    per-worker gauge, averaged over 2 minutes) over twice the median of the workers of its type, for a minute."""
    if not _has(facts, "dynamo-frontend") or max(facts.workers.values(), default=0) < MIN_PEERS:
        return []
    by = "deployment, service, worker_type"
    gauge = f"dynamo_frontend_worker_last_inter_token_latency_seconds{{{_sel(facts)}}}"
    # a worker counts while the frontend lists it now: it drops a lost worker's gauge (Dynamo 1.6.1, seen on kill -9
    # and on restart), but the 2-minute ranges still hold its old samples, and a worker replaced for being slow
    # paged again after the repair. A gauge that stopped moving (kept for a worker the frontend still lists) is
    # no live worker either.
    live = f"(avg_over_time({gauge}[2m]) and changes({gauge}[2m]) > 0 and {gauge})"
    return [Rule(
        "WorkerSlowerThanPeers",
        f"{live} > on ({by}) group_left () 2 * quantile by ({by}) (0.5, {live}) "
        f"and on ({by}) count by ({by}) ({live}) >= {MIN_PEERS}", "warning",
        "{{ $labels.worker_type }} worker {{ $labels.worker_id }} has over twice its peers' median inter-token "
        "latency", "primectl status <recipe> maps the worker id to its service; primectl restart <recipe> <service> "
        "(or drain it) and check its host: primectl preflight <recipe>", for_="1m")]


def gateway(facts: RuleFacts) -> list[Rule]:
    """A fleet's gateway tier: its replicas, the shared breakers, throttling and admission of the deployments
    behind it (each replica reports every deployment: breakers are aggregated with max, in-flight with sum)."""
    if not facts.gateway_replicas or not _has(facts, GATEWAY_JOB):
        return []
    sel, by, n = _sel(facts, job=GATEWAY_JOB), f"deployment, {MEMBER}", facts.gateway_replicas
    live = f"up{{{sel}}} == 1"
    breaker = f"max by ({by}) (primectl_gateway_breaker_open{{{sel}}})"
    answered = f"primectl_gateway_requests_total{{{sel}}}"
    ratio = facts.slo.throttled_ratio
    fleet = "<fleet recipe>"
    return [
        Rule("GatewayReplicaDown", f"up{{{sel}}} == 0", "warning",
             "gateway replica {{ $labels.service }} on {{ $labels.host }} is not answering: the edge sends its "
             "requests to the other replicas",
             f"primectl status {fleet}; primectl logs {fleet} {{{{ $labels.service }}}}; primectl up {fleet} "
             "restarts it", for_=target_down_for(facts)),
        Rule("GatewayReplicasBelowPlan", f"count by (deployment) ({live}) < {n} or absent({live})", "warning",
             f"fewer live gateway replicas than the plan's {n}",
             f"primectl status {fleet} names the replicas that do not answer; primectl up {fleet} starts them",
             for_=target_down_for(facts)),
        Rule("GatewayBreakerOpen", f"{breaker} == 1", "warning",
             f"deployment {{{{ $labels.{MEMBER} }}}}'s circuit breaker is open: the fleet sends it no request",
             f"primectl status <its recipe> and primectl logs <its recipe> frontend say why it fails; once it "
             f"serves, a replica's half-open probe closes the breaker (primectl status {fleet})"),
        Rule("GatewayNoDeploymentAvailable", f"min by (deployment) ({breaker}) == 1", "critical",
             "every deployment of the fleet has its circuit breaker open: the fleet answers no request",
             f"primectl status {fleet}; bring a deployment back with primectl up <its recipe>"),
        Rule("GatewayThrottling",
             f"(sum by (deployment) (rate(primectl_gateway_throttled_total{{{sel}}}[5m])) / sum by (deployment) "
             f"(rate({answered}[5m]))) > {ratio} and sum by (deployment) (increase({answered}[5m])) "
             f">= {MIN_REQUESTS_FOR_RATIO}", "warning",
             f"the fleet answers 429 (every deployment full) to more than {ratio:.0%} of its requests (5 minutes)",
             f"primectl status {fleet} (admitted/capacity); add a deployment or raise its capacity, then "
             f"primectl up {fleet}", for_="2m"),
        Rule("GatewayAdmissionSaturated",
             f"sum by ({by}) (primectl_gateway_inflight_requests{{{sel}}}) >= on ({by}) "
             f"max by ({by}) (primectl_gateway_capacity_slots{{{sel}}})", "warning",
             f"deployment {{{{ $labels.{MEMBER} }}}} has been admitted to its capacity for 5 minutes: new requests "
             "go elsewhere or get 429",
             f"primectl status {fleet} (admitted/capacity); primectl status <its recipe> (queues, KV use); raise "
             "its capacity or add workers", for_="5m"),
    ]


def hardware(facts: RuleFacts) -> list[Rule]:
    """GPUs (dcgm-exporter on GPU hosts) and InfiniBand ports (node_exporter), where the plan has them."""
    out: list[Rule] = []
    if _has(facts, "dcgm-exporter"):
        sel = _sel(facts, job="dcgm-exporter")
        fm = f"DCGM_FI_DEV_FABRIC_MANAGER_STATUS{{{sel}}}"
        out += [
            Rule("GpuXidError", f"DCGM_FI_DEV_XID_ERRORS{{{sel}}} != 0 and changes(DCGM_FI_DEV_XID_ERRORS{{{sel}}}[10m]) > 0",
                 "critical", "GPU {{ $labels.gpu }} on {{ $labels.host }} reported XID {{ $value }}",
                 "primectl drain <recipe> <worker on the GPU>; look the XID up in NVIDIA's XID catalog; most need a "
                 "GPU reset or a reboot of {{ $labels.host }}"),
            Rule("GpuDoubleBitEccError", f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{sel}}}[10m]) > 0", "critical",
                 "GPU {{ $labels.gpu }} on {{ $labels.host }} had an uncorrectable (double-bit) ECC error",
                 "primectl drain <recipe> <worker on the GPU>; reset the GPU; replace it if it repeats"),
            Rule("GpuThermalSlowdown",
                 f"rate(DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS{{{sel}}}[5m]) / 1e9 > 0.01", "warning",
                 "GPU {{ $labels.gpu }} on {{ $labels.host }} is slowed down by heat (clocks halved)",
                 "check the host's cooling; primectl drain <recipe> <worker on the GPU> if it persists", for_="5m"),
            Rule("FabricManagerNotReady", f"{fm} != 3 and {fm} != 0", "critical",
                 "Fabric Manager is not running on {{ $labels.host }} (status {{ $value }}): NVLink is unusable",
                 "systemctl status nvidia-fabricmanager on {{ $labels.host }}; restart it, then primectl up <recipe>",
                 for_="5m"),
        ]
        if facts.nvlink_domain:
            out += [
                Rule("NvlinkRecoveries",
                     f"increase(DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS{{{sel}}}[15m]) > 0", "warning",
                     "NVLink links of GPU {{ $labels.gpu }} on {{ $labels.host }} went into recovery: a link is "
                     "degrading", "primectl preflight <recipe> (NVLink); plan a tray swap before it fails"),
                Rule("NvlinkRecoveryFailed",
                     f"increase(DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS{{{sel}}}[15m]) > 0", "critical",
                     "an NVLink link of GPU {{ $labels.gpu }} on {{ $labels.host }} failed recovery and is down",
                     "primectl drain <recipe> <workers on {{ $labels.host }}>; reseat or replace the tray"),
                Rule("NvlinkBitErrorRateHigh",
                     f"DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER_FLOAT{{{sel}}} > 1e-9", "warning",
                     "NVLink effective bit error rate of GPU {{ $labels.gpu }} on {{ $labels.host }} is over 1e-9",
                     "primectl preflight <recipe> (NVLink); plan a tray swap", for_="5m"),
                Rule("ImexNotReady", f"DCGM_FI_IMEX_DAEMON_STATUS{{{sel}}} != 5", "critical",
                     "the IMEX daemon on {{ $labels.host }} is not ready (status {{ $value }}): multi-node NVLink "
                     "memory sharing fails", "systemctl status nvidia-imex on {{ $labels.host }}; nvidia-imex-ctl -q; "
                     "then primectl up <recipe>", for_="5m"),
            ]
    if _has(facts, "node-exporter") and facts.infiniband:
        sel = _sel(facts, job="node-exporter")
        port = "{{ $labels.device }} port {{ $labels.port }} on {{ $labels.host }}"
        out += [
            Rule("InfinibandPortNotActive",
                 f"node_infiniband_state_id{{{sel}}} != 4 and node_infiniband_physical_state_id{{{sel}}} == 5",
                 "critical", f"InfiniBand {port} has link but is not ACTIVE (state {{{{ $value }}}})",
                 "check the subnet manager (sminfo, ibstat); primectl preflight <recipe>", for_="1m"),
            Rule("InfinibandLinkDown", f"node_infiniband_physical_state_id{{{sel}}} != 5", "critical",
                 f"InfiniBand {port} has no physical link (state {{{{ $value }}}})",
                 "ibstat on the host; reseat the cable or transceiver; primectl preflight <recipe>",
                 for_=_times(facts.scrape_interval, 3)),
            Rule("InfinibandLinkFlapping", f"increase(node_infiniband_link_downed_total{{{sel}}}[15m]) > 0",
                 "warning", f"InfiniBand {port} went down and up again",
                 "ibstat and the switch port's counters; primectl preflight <recipe>; replace the cable if it "
                 "repeats"),
        ]
    return out


def self_monitoring(facts: RuleFacts) -> list[Rule]:
    """Alerts about the monitoring itself."""
    sel = _sel(facts)
    out = [Rule(
        "Watchdog", "vector(1)", "none",
        "always firing: proves the path from Prometheus to Alertmanager to the receiver works",
        "if the heartbeat receiver stops hearing this, monitoring is down: primectl status <recipe> (prometheus, "
        "alertmanager); primectl logs <recipe> alertmanager")]
    if _has(facts, "prometheus"):
        out += [
            Rule("PrometheusConfigReloadFailed", f"prometheus_config_last_reload_successful{{{sel}}} == 0", "warning",
                 "Prometheus runs an old configuration: its last reload failed",
                 "primectl logs <recipe> prometheus; promtool check config on it; primectl up <recipe>"),
            Rule("RuleEvaluationFailing",
                 f"sum by (deployment, rule_group) (increase(prometheus_rule_evaluation_failures_total{{{sel}}}[5m])) > 0",
                 "warning", "rules of {{ $labels.rule_group }} fail to evaluate: their alerts cannot fire",
                 "primectl logs <recipe> prometheus names the rule and the error"),
            Rule("AlertmanagerUnreachable",
                 f"sum by (deployment) (increase(prometheus_notifications_errors_total{{{sel}}}[5m])) > 0", "warning",
                 "Prometheus fails to send alerts to Alertmanager",
                 "primectl status <recipe> (alertmanager); primectl logs <recipe> alertmanager"),
        ]
    if _has(facts, "alertmanager"):
        out += [
            Rule("AlertmanagerConfigReloadFailed", f"alertmanager_config_last_reload_successful{{{sel}}} == 0",
                 "warning", "Alertmanager runs an old configuration: its last reload failed",
                 "primectl logs <recipe> alertmanager; amtool check-config on it; primectl up <recipe>"),
            Rule("NotificationsFailing",
                 f"sum by (deployment, integration) (increase(alertmanager_notifications_failed_total{{{sel}}}[5m])) > 0",
                 "warning", "Alertmanager fails to deliver notifications by {{ $labels.integration }}",
                 "primectl logs <recipe> alertmanager; check the recipe's monitoring.alerts receiver is reachable"),
        ]
    return out + guards(facts)


def guarded_fields(facts: RuleFacts) -> list[tuple[str, str, str | None]]:
    """(job, metric, condition) for each exporter field a planned rule reads: the field must be present on every
    target of the job that is up (and, with a condition, that meets it: a worker only after it served)."""
    out: list[tuple[str, str, str | None]] = []
    if _has(facts, "dcgm-exporter"):
        fields = DCGM_FIELDS + (NVLINK_DOMAIN_FIELDS if facts.nvlink_domain else ())
        out += [("dcgm-exporter", name, None) for name in fields]
    if _has(facts, "node-exporter") and facts.infiniband:
        out += [("node-exporter", m, None) for m in ("node_infiniband_state_id", "node_infiniband_physical_state_id",
                                                     "node_infiniband_link_downed_total")]
    for component in KV_USAGE_WORKERS:
        if _has(facts, component):
            served = f"dynamo_component_requests_total{{{_sel(facts, job=component)}}} > 0"
            out.append((component, "dynamo_component_gpu_cache_usage_percent", served))
            out.append((component, ENGINE_COUNTERS[component]["preemptions"], served))
    return out


def guards(facts: RuleFacts) -> list[Rule]:
    """FieldMissing: a field a rule reads is missing from a target that is up, so that rule could never fire."""
    out = []
    for job, metric, condition in guarded_fields(facts):
        up = f"group by ({TARGET}) (up{{{_sel(facts, job=job)}}} == 1)"
        expr = f"{up} unless on ({TARGET}) group by ({TARGET}) ({metric}{{{_sel(facts, job=job)}}})"
        if condition:
            expr = f"({expr}) and on ({TARGET}) group by ({TARGET}) ({condition})"
        out.append(Rule(
            "FieldMissing", expr, "warning",
            f"{{{{ $labels.service }}}} on {{{{ $labels.host }}}} exports no {metric}: the alerts that read it "
            "cannot fire", "primectl logs <recipe> {{ $labels.service }}; check the exporter's version and "
            "configuration exports the field", for_="5m", labels={"metric": metric}))
    return out


def rule_groups(facts: RuleFacts) -> list[dict[str, Any]]:
    """Every group, in a stable order."""
    groups = [("availability", availability(facts)), ("quality", quality(facts)),
              ("gray-failure", gray_failure(facts)), ("gateway", gateway(facts)), ("hardware", hardware(facts)),
              ("self-monitoring", self_monitoring(facts))]
    return [{"name": f"primectl-{name}", "rules": [r.doc(facts.deployment) for r in rules]}
            for name, rules in groups if rules]


def rules_yaml(facts: RuleFacts) -> str:
    """The rule file: its groups, as bare-metal Prometheus loads them."""
    return groups_yaml(rule_groups(facts))


def groups_yaml(groups: list[dict[str, Any]]) -> str:
    """Rule groups as a rule file's text (an expression stays on one line): the bytes a PrometheusRule's
    `spec.groups` must dump to as well."""
    return safe_dump({"groups": groups}, sort_keys=False, default_flow_style=False, width=100_000)

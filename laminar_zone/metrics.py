"""Prometheus metrics of laminar-zone (``laminar_zone_*``, base units, injectable registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from laminar_agent.metrics import add_build_info

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_COUNT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
_QUEUE_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400, 86400)
#: Distinct tenant label values on the usage counters; later tenants share ``OTHER_TENANT``.
#: Tenants come from the tokens file (auth on) or from submissions (auth off), hence the cut.
MAX_TENANT_LABELS = 256
OTHER_TENANT = "_other"
_USAGE_BOUND = (
    f"; by tenant (at most {MAX_TENANT_LABELS} distinct, later ones as {OTHER_TENANT})"
    " and slice_kind (gpu:MODEL, mig:PROFILE, share:MODEL, cpu); counted when a subjob ends"
)


class ZoneMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        add_build_info(r, "zone")
        self.submitted = Counter(
            "laminar_zone_jobs_submitted_total", "Jobs accepted by Submit", registry=r
        )
        self.finished = Counter(
            "laminar_zone_jobs_finished_total",
            "Jobs that reached a terminal state, by state",
            ["state"],
            registry=r,
        )
        self.jobs = Gauge("laminar_zone_jobs", "Live jobs by state", ["state"], registry=r)
        self.placements = Counter(
            "laminar_zone_placements_total",
            "Placement tries by outcome (placed, queued, commit_failed)",
            ["outcome"],
            registry=r,
        )
        self.placement_seconds = Histogram(
            "laminar_zone_placement_duration_seconds",
            "Probe-to-commit time of one successful placement",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.probes_per_placement = Histogram(
            "laminar_zone_placement_probes",
            "Probes sent per successful placement",
            buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.bounces_per_placement = Histogram(
            "laminar_zone_placement_bounces",
            "Bounced probes per successful placement",
            buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.queue_length = Gauge(
            "laminar_zone_queue_jobs",
            "Jobs waiting in the queue by priority class",
            ["priority"],
            registry=r,
        )
        self.queue_seconds = Histogram(
            "laminar_zone_queue_wait_seconds",
            "Time from entering the queue to placement, by priority class",
            ["priority"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.agents = Gauge("laminar_zone_agents", "Agents by state", ["state"], registry=r)
        self.heartbeats = Counter(
            "laminar_zone_heartbeats_total", "Agent heartbeats received", registry=r
        )
        self.heartbeat_summaries = Counter(
            "laminar_zone_heartbeat_summaries_total",
            "Agent heartbeats that carried the full summary (the others only refreshed liveness)",
            registry=r,
        )
        self.journal_commits = Counter(
            "laminar_zone_journal_commits_total",
            "Commits of the router's journal that wrote jobs or usage rows (a group commit "
            "counts once)",
            registry=r,
        )
        self.retries = Counter(
            "laminar_zone_job_retries_total", "Job attempts started after a failure", registry=r
        )
        self.subjobs_ended = Counter(
            "laminar_zone_subjobs_ended_total",
            "Subjobs whose end the router recorded, by end cause (exited, time_limit, lost, "
            "launch_failed, ...)",
            ["cause"],
            registry=r,
        )
        self.readdressed = Counter(
            "laminar_zone_subjobs_readdressed_total",
            "Suspended subjobs moved to another host at Airlock's request",
            registry=r,
        )
        self.forwarded = Counter(
            "laminar_zone_jobs_forwarded_total",
            "Jobs sent to a peer zone by flow splitting",
            registry=r,
        )
        self.clearing_round_seconds = Histogram(
            "laminar_zone_clearing_round_duration_seconds",
            "Time of one atomization clearing round (bids, clearing, materialization)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.atomized_subjobs = Histogram(
            "laminar_zone_atomized_job_subjobs",
            "Subjobs an atomized job ran, observed when it succeeds",
            buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.window_fill = Histogram(
            "laminar_zone_window_fill_ratio",
            "Expected run time of a started atomized subjob over its window's length",
            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0),
            registry=r,
        )
        self.window_extensions = Counter(
            "laminar_zone_window_extensions_total",
            "Windows an atomized piece extended in place at their end (incumbency: no "
            "checkpoint, no restart)",
            registry=r,
        )
        self.atomized_observations = Counter(
            "laminar_zone_atomized_subjobs_observed_total",
            "Ended atomized subjobs whose time and memory fed the calibration",
            registry=r,
        )
        self.atomized_violations = Counter(
            "laminar_zone_atomized_violations_total",
            "Observed atomized subjobs that overran their predicted time or memory "
            "(violation rate = this / laminar_zone_atomized_subjobs_observed_total)",
            registry=r,
        )
        self.usage_gpu_seconds = Counter(
            "laminar_zone_usage_gpu_seconds_total",
            "GPU-seconds used by ended subjobs (GPU-equivalents x run seconds)" + _USAGE_BOUND,
            ["tenant", "slice_kind"],
            registry=r,
        )
        self.usage_gpu_memory_byte_seconds = Counter(
            "laminar_zone_usage_gpu_memory_byte_seconds_total",
            "GPU memory held by ended subjobs x run seconds (observed peak, else declared)"
            + _USAGE_BOUND,
            ["tenant", "slice_kind"],
            registry=r,
        )
        self.usage_lost_gpu_seconds = Counter(
            "laminar_zone_usage_work_lost_gpu_seconds_total",
            "GPU-seconds of work lost to Airlock (reclaimed, preempted, re-addressed subjobs)"
            + _USAGE_BOUND,
            ["tenant", "slice_kind"],
            registry=r,
        )

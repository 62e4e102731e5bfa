"""Prometheus metrics of one server (its own registry, so two apps in one process never mix).

Vocabulary as everywhere in draftless: drafted, accepted, verify steps, plain steps.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "draftless_requests", "requests answered", ["endpoint", "status"], registry=r
        )
        self.cancelled = Counter(
            "draftless_cancelled_requests",
            "runs stopped between decoder steps (client gone, shutdown)",
            registry=r,
        )
        self.prompt_tokens = Counter("draftless_prompt_tokens", "prompt tokens", registry=r)
        self.reused_tokens = Counter(
            "draftless_reused_prompt_tokens",
            "prompt tokens whose KV cache was kept from the previous request",
            registry=r,
        )
        self.completion_tokens = Counter(
            "draftless_completion_tokens", "generated tokens", registry=r
        )
        self.drafted = Counter("draftless_drafted_tokens", "draft tokens verified", registry=r)
        self.accepted = Counter("draftless_accepted_tokens", "draft tokens accepted", registry=r)
        self.steps = Counter("draftless_decode_steps", "forwards after the prompt", registry=r)
        self.verify_steps = Counter(
            "draftless_verify_steps", "forwards that checked a draft", registry=r
        )
        self.edits_learned = Counter(
            "draftless_edits_learned",
            "substitutions (renames, changed values) the edit learner took from the streams",
            registry=r,
        )
        self.acceptance = Gauge(
            "draftless_acceptance_ratio", "accepted / drafted since start", registry=r
        )
        self.verify_share = Gauge(
            "draftless_verify_share", "verify steps / decode steps since start", registry=r
        )
        self.queue_depth = Gauge(
            "draftless_queue_depth", "requests waiting for the model", registry=r
        )
        self.index_bytes = Gauge(
            "draftless_index_bytes",
            "bytes charged by the cross-request draft index (<= --index-budget)",
            registry=r,
        )
        self.index_tokens = Gauge(
            "draftless_index_tokens", "tokens held by the cross-request draft index", registry=r
        )
        self.index_budget = Gauge(
            "draftless_index_budget_bytes", "the cross-request index's byte budget", registry=r
        )
        self.latency = Histogram(
            "draftless_request_seconds",
            "time from arrival to the last token",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )

        self._totals = [0, 0, 0, 0]  # drafted, accepted, steps, verify steps (worker only)

    def record_decode(self, drafted: int, accepted: int, steps: int, verify_steps: int) -> None:
        """One request's decode stats (called by the engine's worker thread alone)."""
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        self.steps.inc(steps)
        self.verify_steps.inc(verify_steps)
        t = self._totals
        t[0] += drafted
        t[1] += accepted
        t[2] += steps
        t[3] += verify_steps
        if t[0]:
            self.acceptance.set(t[1] / t[0])
        if t[2]:
            self.verify_share.set(t[3] / t[2])

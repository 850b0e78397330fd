"""The rollout job's start-up check of what it reads and writes.

A misspelled subscription or topic, or a policy store whose bucket is missing, would
otherwise surface only at first use inside the runner, which retries bundles (Dataflow
for ever): here it stops the launch with the resource named (pubsub_io.PermanentError,
store.StoreAccessError). Skipped on a dry run, which must work offline.
"""

from __future__ import annotations

import logging

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.config import RolloutIOConfig
from pipelines.dry_run import is_dataflow_dry_run


def check_resources(io: RolloutIOConfig, options: PipelineOptions) -> None:
    if is_dataflow_dry_run(options):
        return
    from core.contracts import pubsub_io
    from core.contracts.store import PolicyStore

    topics = [io.records_topic, *([io.dead_letter_topic] if io.dead_letter_topic else [])]
    for note in pubsub_io.preflight(subscriptions=[io.requests_subscription], topics=topics):
        logging.info("start-up check: %s", note)
    if note := PolicyStore(io.policy_root).check_access():
        logging.info("start-up check: %s", note)

"""The rollout job's flags as Beam pipeline options, generated from RolloutJobConfig
(pipelines/config.py), and the checked configs built from them.

Beam builds one parser for every registered options class; `RolloutOptions` adds the
config tree's flags to it. Beam's own flags (--runner, --project, --streaming) stay Beam's.
"""

from __future__ import annotations

import typing

from apache_beam.options.pipeline_options import PipelineOptions

from core import config
from pipelines.config import RolloutJobConfig, from_values


class _ListFlagsAsText:
    """Beam re-creates the options on each worker from a dict of parsed values, and writes
    a list there as the flag repeated once per item (of which argparse keeps the last): a
    list-valued flag (--buckets=128,256) therefore stays text in Beam's options, and
    core.config parses it when the tree is built."""

    def __init__(self, parser):
        self.parser = parser

    def add_argument(self, *names, **kw):
        leaf = _LIST_FLAGS.get(names[0])
        if leaf is not None:
            kw["type"] = str
            kw["default"] = ",".join(map(str, leaf.default))
        return self.parser.add_argument(*names, **kw)


_LIST_FLAGS = {
    f"--{leaf.flag}": leaf
    for leaf in config.leaves(RolloutJobConfig)
    if typing.get_origin(leaf.type) is tuple and not leaf.repeat
}


class RolloutOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        config.add_arguments(_ListFlagsAsText(parser), RolloutJobConfig)


def rollout_config(options: PipelineOptions) -> RolloutJobConfig:
    """The whole checked tree from Beam's options (the launcher's, or those a worker
    re-creates): a bad setting is refused with a ValueError naming it."""
    return from_values(options.get_all_options())

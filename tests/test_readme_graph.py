"""The rollout-graph diagram in docs/ARCHITECTURE.md (moved there from the README) names the
graph's real step labels, all of them."""

import pathlib
import re

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import job

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
OWN_COMPOSITES = ("RunEpisodes", "Pack")  # their inner steps are ours; other composites are Beam's


def graph_labels() -> set[str]:
    flags = [
        "--streaming",
        "--requests_subscription=projects/p-123456/subscriptions/s",
        "--records_topic=projects/p-123456/topics/t",
        "--dead_letter_topic=projects/p-123456/topics/d",
        "--policy_root=/tmp/unused-store",
        "--content_dedup",  # the optional step the diagram shows in brackets
    ]
    options = PipelineOptions(flags)
    p = beam.Pipeline(options=options)
    job.build(p, options)
    labels = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            parts = node.full_label.split("/") if node.full_label else []
            if len(parts) == 1 or (len(parts) == 2 and parts[0] in OWN_COMPOSITES):
                labels.add(parts[-1])

    p.visit(Visitor())
    return labels


def diagram_names() -> set[str]:
    text = DOC.read_text()
    start = text.index("The rollout graph (`pipelines/job.py`")
    block = text[text.index("```\n", start) + 4 :]
    block = block[: block.index("```")]
    block = re.sub(r"\([^)]*\)", "", block)  # "(AsyncWrapper)", "(Pub/Sub)": notes, not steps
    return set(re.findall(r"[A-Z][A-Za-z]+", block))


def test_readme_graph_names_exactly_the_graphs_steps():
    labels, names = graph_labels(), diagram_names()
    assert names - labels == set(), "docs/ARCHITECTURE.md names steps the graph does not have"
    assert labels - names == set(), "the graph has steps docs/ARCHITECTURE.md does not show"

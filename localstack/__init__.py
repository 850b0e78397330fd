"""The embedded local stack: emulators/ (Pub/Sub, GCS), launch/ (the demo, the planner,
process supervision), reports/ (live panel, run report, summary)."""

"""Cloud launchers: the Vertex AI custom job and multi-host start-up."""

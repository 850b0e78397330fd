"""Local embedded stack (Pub/Sub emulator, local policy store) for demos and tests."""

"""Learner side: policy model, packed-record contract, policy store, losses, learner, feeder."""

"""The learner's data plane: rollout requests out (feeder, credits), packed records in
(consumer, staleness, batches), each held until a checkpoint covers it (deliveries), and
every trajectory accounted for."""

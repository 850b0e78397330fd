"""What every process of a run reports, in files tools read: scalars (TensorBoard event
files and JSONL rows, `scalars.py`) and a timeline of spans (Chrome trace-event JSON that
ui.perfetto.dev opens, `trace.py`). Both sides import it; it imports nothing of theirs."""

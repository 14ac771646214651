"""The store: the bounded history of a run's steps, its series, and the trace file (writer and reader)."""

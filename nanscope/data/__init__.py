"""The data a run trains on, below the model and the engine.

File readers (shared with check-data), batches, inputs, targets and synthetic sets.
"""

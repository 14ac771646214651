"""The report model (what a run found, attributed and ranked), and the writers that draw it: TensorBoard, plots."""

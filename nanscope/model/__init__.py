"""Building what the spec names: the model, its optimizer and learning rate, factories, user-code locations."""

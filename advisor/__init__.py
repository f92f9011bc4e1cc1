"""advisor: which optimizer and memory strategy for this transformer, under this constraint, from evidence."""

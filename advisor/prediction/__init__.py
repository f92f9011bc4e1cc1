"""`advisor fit`'s torch-free side: the question, the traced step's vocabulary and arithmetic, the cache of
predictions, the answer and the code to run it. The tracer itself is the measurement side's
(advisor/measuring/tracer/engine.py), passed in by the caller."""

"""Answers from evidence: choosing the evidence group, ranking it (recommendation), the Pareto frontier,
the flowchart, the paper's claims, and the statistics they rest on. Torch-free."""

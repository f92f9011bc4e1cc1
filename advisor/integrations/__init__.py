"""Evidence from training people run themselves: `advisor.integrations.transformers.AdvisorCallback`."""

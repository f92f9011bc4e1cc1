"""The grid of `advisor measure`: cells chosen, each run in a fresh process, here or on a Ray cluster, shards."""

"""The knowledge base: its schema (migrations) and the checks that open it, the one write path (store, with
leases and summaries), reading it (groups, figures, the shipped KB and the user's together), and the ways
runs come in and go out (ingest, build, merge, export)."""

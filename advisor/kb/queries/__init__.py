"""What is read from a knowledge base, one module per reader: `groups` what several share (the evidence
groups, a group's id across two KBs, the one parse of a stored JSON column); `for_answers` recommend,
frontier, flowchart, claims and transfer; `for_prediction` advisor fit's cached traces, speed calibrations
and tuned rates; `for_planning` the past runs a plan prices from; `for_report` the report and the kb
commands (stats, listings, exports); `audit` a stored KB held to advisor.kb.admission's rules in SQL.
Opening a KB is advisor.kb.open's; writing one, advisor.kb.store's."""

"""A run's metrics log: verl's file-logger JSONL read by one set of rules (``file``) and a run's metrics history
across resumes, one segment per trainer start (``history``); the harness, the driver, the reports and the study
read it here."""

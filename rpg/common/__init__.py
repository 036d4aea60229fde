"""Small pieces every layer above the math shares, torch-free and verl-free.

* ``overrides``: Hydra override parsing (Hydra's own parser), merging and value quoting;
* ``user_paths``: a path the user names, absolute, relative to where the user is (launcher, demos, study);
* ``run_env``: the environment a run's processes get (W&B, Ray auth, verl's external modules);
* ``signals``: SIGHUP/SIGINT/SIGTERM as a ``StopSignal`` exception (the driver and the launchers);
* ``metrics_file``: verl's file-logger JSONL read by one set of rules (the harness, the reports, the driver);
* ``history``: a run's metrics history across resumes (file-logger segments, the step record).
"""

"""The prefix of the one line a refused config prints (driver and launchers), torch-free: the
launchers (``rpg.trainer_process``) match the driver's line by it and must not pay for importing the
driver's modules before they start the trainer."""

ERROR_PREFIX = "rpg config error"
# The driver's resume decision, one line per run (``rpg.verl.input_paths.resolve_resume``): the launchers that
# run the driver under the harness show it on the terminal (``rpg.trainer_process.resume_decision``)
RESUME_LINE_STARTS = ("rpg: resuming from ", "rpg: fresh start ")
# The command that resumes a run when a launcher knows it better than the driver's own command line (a job on a
# Ray cluster is resumed by submitting it again): set by the launcher (``rpg.override_lists.resume_command``),
# read by the driver's stop line
RESUME_COMMAND_ENV = "RPG_RESUME_COMMAND"
# The node counts a run submitted to a Ray cluster may take (``rpg.cluster``: NNODES as given, and the counts that
# pass the driver's rules; separate_async: its standalone rollout pool's nodes), JSON ``{"nnodes": "1:2", "sizes":
# [1, 2], "rollout_nnodes": 1}``: the stop line's resume command asks for a count the cluster can hold, the pool's
# nodes kept aside, when a node was lost (``rpg.node_counts.nnodes_for_resume``)
NODE_PLAN_ENV = "RPG_NODE_PLAN"
# Set by the elastic supervisor (``rpg.cluster.elastic``) for the trainer it starts: where the trainer writes why
# it stopped when a node was lost, exiting with ELASTIC_EXIT instead of printing the stop line
ELASTIC_STATUS_ENV = "RPG_ELASTIC_STATUS"
ELASTIC_EXIT = 75  # EX_TEMPFAIL: a node of the run was lost; the supervisor decides whether the run goes on
# Beside that status file: the trainer's Ray job id, written once Ray is up (the supervisor waits for that job to be
# gone before it starts another trainer), and the supervisor's request to grow, written before its SIGTERM
ELASTIC_JOB_SUFFIX, ELASTIC_GROW_SUFFIX = ".job", ".grow"
# Set by a launcher for the driver it starts after making the launch's checks itself (the harness, a Ray job of the
# cluster layer): main_rpg.py then runs the command line as it is (``rpg.launch.entry.hydra_reads``)
LAUNCHED_ENV = "RPG_LAUNCHED"

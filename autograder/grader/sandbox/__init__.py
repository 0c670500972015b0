"""How a grading worker is started and what runs in it: the sandbox (bubblewrap, an unprivileged uid, rlimits,
control groups), the devices every worker gets, and the worker process itself (the zygote that runs the tasks)."""

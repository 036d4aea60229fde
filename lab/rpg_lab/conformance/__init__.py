"""The KL-gradient conformance report (docs/conformance.md): every major RL framework's KL term, called from its
released code, scored against the exact gradients of the divergences it may regularise, by exact enumeration over
small categorical policies, on-policy and off-policy. ``python -m rpg_lab.conformance`` rebuilds it.

``scenarios`` (the policies and samplers), ``probes`` (each framework's term, run in its own environment),
``catalogue`` (the frameworks and settings), ``scoring`` (expected gradients and distances), ``table`` (the rows),
``report`` (markdown and figure), ``environments`` (where each probe runs).
"""

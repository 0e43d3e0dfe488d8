"""kubegpu's scheduler: the scheduling core (``scheduler.core``) and the trace simulator (``scheduler.sim``).

The core is pure and in-memory (no Kubernetes imports): the live scheduler, the scheduler extender
and the simulator all place pods through ``scheduler.core.schedule_one``.
"""

"""The constants of the latency form (``model.py`` trains it, ``export.py`` writes it): kept
free of torch so that serving never imports it."""

from __future__ import annotations

HEADS = ("u_compute", "u_memory", "r_cache", "setup", "fixed", "wave_rate",
         "knee_compute", "slope_compute", "knee_memory", "slope_memory")
KNEE_SCALE = 4.0  # knee logit -> log(ms) of the size where utilization saturates: +-4 * 30
SETUP_HIDDEN = 16  # the setup head's own small MLP (it may not see the tile)
SETUP_MAX = 4.0  # launches of per-wave prologue/epilogue, at most
FIXED_MAX = 20.0  # a kernel's fixed GPU cost: at most 21 launch overheads
P_BUSY = 4.0  # smooth max of compute and memory time
Q_HOST = 6.0  # smooth max of host dispatch and GPU time (the host runs ahead)
VENDORS = ("nvidia", "amd")

"""Per-node cost formulas by family. Importing this package registers every formula (and the
zero-cost ops) in the global ``REGISTRY``; see ``tilecast.analyzer.registry``."""

from __future__ import annotations

from . import (  # noqa: F401  (imported for their registrations)
    attention,
    contrib,
    conv,
    elementwise,
    experts,
    gather,
    generators,
    matmul,
    movement,
    normalization,
    pooling,
    reduction,
    rnn,
    sampling,
    softmax,
    spectral,
    zero,
)

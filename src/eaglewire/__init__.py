"""eaglewire: EAGLE-3 drafters whose hidden-state wiring is right by construction.

The package reads as the pipeline: ``points``/``targets``/``capture`` (what a
target is and where features come from) -> ``data/`` -> ``drafter/`` and
``train`` -> ``decoding/`` -> ``export/`` -> ``doctor/`` -> ``demo``.

Imports inside functions: the ``cli`` modules and the command functions
they register import torch, transformers and the stage modules inside the
function that needs them, so ``eaglewire --help`` and a usage error answer in
well under a second instead of the ~3 s torch and transformers take to
import. That is the one reason for a function-local import in this package;
modules that always need torch import it at the top.
"""

__version__ = "0.2.0"

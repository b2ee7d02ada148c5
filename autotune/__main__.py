"""`python -m autotune`: the console script, for a checkout run without installing it
(`PYTHONPATH=. python -m autotune MODEL --gpus N`)."""

import sys

from autotune.entry import main

sys.exit(main())

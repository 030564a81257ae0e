"""The checkpoint benchmark (issue: fast checkpoints), as run for the README's figures.

    python benchmarks/checkpoint.py --dir /path/on/the/disk/to/measure        # ~1.2 GB + 10,000 small tensors
    preemptible bench --dir ...                                                # the same scenarios

Scenarios, contenders and ratios live in ``preemptible.bench`` so the command line runs the very same code.
"""

from __future__ import annotations

import sys

from preemptible.cli import main

if __name__ == "__main__":
    from _record import recorded  # benchmarks/_record.py: the result, with machine, date and command

    sys.exit(recorded(lambda: main(["bench", *sys.argv[1:]]), "checkpoint"))

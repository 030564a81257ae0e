import sys

from preemptible.cli import main

sys.exit(main())

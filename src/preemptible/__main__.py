import os
import sys

# `python -m preemptible` puts the working directory first on sys.path: inside a checkpoint root, a file there named
# like a module would be imported. Nothing of this command is found that way (the package is imported already).
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from preemptible.cli import main

sys.exit(main())

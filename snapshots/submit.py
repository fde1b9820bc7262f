"""The file to hand spark-submit: `spark-submit --jars <kafka connector jars> snapshots/submit.py --bootstrap-servers
... --app-id APP`. It runs the installed `snapshots.compact`, so that the executors unpickle its functions (and those
of snapshots.fold) by reference to an importable module, never to `__main__`. spark-submit also puts this directory
first on sys.path: no module in it may be named like a library the job imports."""

from __future__ import annotations

import sys

from snapshots.compact import main

if __name__ == "__main__":
    sys.exit(main())

import sys

from tools.bench.throughput import main

sys.exit(main())

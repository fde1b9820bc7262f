import sys

from tools.bench.peers.bench import main

sys.exit(main())

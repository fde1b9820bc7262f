import sys

from pipeline.peers.bench import main

sys.exit(main())

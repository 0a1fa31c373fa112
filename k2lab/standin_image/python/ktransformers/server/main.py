"""`python3 -m ktransformers.server.main`: the k2provision stand-in (lab image only)."""

import sys

from k2standin.ktransformers_server import main

if __name__ == "__main__":
    sys.exit(main())

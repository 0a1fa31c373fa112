"""`python3 -m sglang.launch_server`: the k2provision stand-in (lab image only)."""

import sys

from k2standin.sglang_server import main

if __name__ == "__main__":
    sys.exit(main())

"""`python3 -m sglang_router.launch_router`: the k2provision stand-in (lab image only)."""

import sys

from k2standin.router import main

if __name__ == "__main__":
    sys.exit(main())

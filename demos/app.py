"""Start the mmspec demo: `python demos/app.py [--port N]` (the same as `mmspec demo`)."""

import sys

from mmspec.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))

"""`python -m sandbox.host '<limits json>'`: run one sandbox host (see `sandbox.host.main`)."""

import sys

from sandbox.host.main import main

if __name__ == "__main__":
    sys.exit(main())

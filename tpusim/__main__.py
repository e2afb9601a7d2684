import sys

from tpusim.cli import main

sys.exit(main())

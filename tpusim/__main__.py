import sys

from tpusim.app.cli import main

sys.exit(main())

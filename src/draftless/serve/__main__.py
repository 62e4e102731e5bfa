import sys

from draftless.serve.cli import main

sys.exit(main())

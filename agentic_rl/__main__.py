import sys

from agentic_rl.cli import main

sys.exit(main())

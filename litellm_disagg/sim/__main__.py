import sys

from litellm_disagg.sim.cli import main

sys.exit(main())

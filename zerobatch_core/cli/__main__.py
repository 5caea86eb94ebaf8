"""``python -m zerobatch_core.cli``, the same as ``python -m zerobatch_core``."""

from .main import main

raise SystemExit(main())

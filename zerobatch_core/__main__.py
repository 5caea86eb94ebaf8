"""``python -m zerobatch_core``: the ``zerobatch`` command line."""

from .cli import main

raise SystemExit(main())

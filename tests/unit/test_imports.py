"""The core imports no framework and no optional text library: numpy and construct only."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = (
    "torch",
    "jax",
    "jaxlib",
    "tensorflow",
    "keras",
    "pyarrow",
    "tokenizers",
    "tiktoken",
    "ray",
    "obstore",
    "fsspec",
    "s3fs",
    "boto3",
)


def test_core_and_adapters_package_import_no_framework() -> None:
    code = (
        "import json, sys\n"
        "import zerobatch_core, zerobatch_spec, zerobatch_conformance, zerobatch_adapters\n"
        "import zerobatch_core.ingest.convert, zerobatch_core.cli\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & set(OPTIONAL), loaded & set(OPTIONAL)
    assert {"numpy", "construct"} <= loaded

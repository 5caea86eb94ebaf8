"""``zerobatch inspect`` and ``zerobatch validate`` of a mixture file (README, "Mixtures").

``inspect_validate`` hands a path here when it is a JSON mixture file. ``inspect`` prints the
blend (components, their weights in every phase, the global batch size and steps) and each
component's shape, opening each component (its manifest or header only). ``validate`` checks
every component as ``zerobatch validate`` checks it on its own (``--deep`` included), then that
the components fit together (one ``seq_len``, at least one global batch each); it is valid
when every component is.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import redirect_stdout
from decimal import Decimal
from io import StringIO
from typing import Any

from zerobatch_spec.mixture import WEIGHT_DIGITS

from ..delivery.mixture import Mixture, MixtureError, MixtureSource, load_mixture
from ..delivery.sources import source_token_dtype
from ..errors import ZeroBatchError
from .common import EXIT_INVALID, EXIT_OK, plural, print_table, report_invalid


def _weight(units: int) -> str:
    """Units of 1e-9 as the decimal a user wrote."""
    return format(Decimal(units).scaleb(-WEIGHT_DIGITS).normalize(), "f")


def describe(mixture: Mixture) -> dict[str, Any]:
    """The blend, its phases with decimal weights by name."""
    names = mixture.names
    return {
        "components": [
            {
                "name": c.name,
                "source": str(c.source),
                "weight": _weight(mixture.phases[0].weights[i]),
            }
            for i, c in enumerate(mixture.components)
        ],
        "phases": [
            {
                "start": p.start,
                "weights": {n: _weight(w) for n, w in zip(names, p.weights, strict=True)},
            }
            for p in mixture.phases
        ],
        "global_batch_size": mixture.global_batch_size,
        "steps": mixture.steps,
    }


def _load(args: argparse.Namespace, command: str) -> Mixture | int:
    try:
        return load_mixture(args.file)
    except MixtureError as e:
        return report_invalid(
            command, args.file, {"code": "mixture", "detail": str(e)}, e, args.json
        )


def inspect(args: argparse.Namespace) -> int:
    mixture = _load(args, "inspect")
    if isinstance(mixture, int):
        return mixture
    info = {"path": args.file, **describe(mixture)}
    try:
        with MixtureSource(mixture, verify="off") as source:
            g = source.global_batch_size
            info["global_batch_size"] = g
            info["seq_len"] = source.seq_len
            info["dtype"] = source.token_dtype.name  # what "native" serves: the widest
            for i, entry in enumerate(info["components"]):
                reader = source.component(i)
                entry.update(
                    batch_size=reader.batch_size,
                    num_batches=reader.num_batches,
                    steps_per_epoch=reader.num_batches * reader.batch_size // g,
                    dtype=source_token_dtype(reader).name,
                )
    except (ZeroBatchError, ValueError) as e:
        return report_invalid(
            "inspect", args.file, {"code": "mixture", "detail": str(e)}, e, args.json
        )
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    print_table(
        {
            "path": args.file,
            "components": len(mixture.components),
            "phases": len(mixture.phases),
            "global_batch_size": info["global_batch_size"],
            "seq_len": info["seq_len"],
            "dtype": info["dtype"],
            "steps": "endless" if mixture.steps is None else mixture.steps,
        }
    )
    for entry in info["components"]:
        print(
            f"  {entry['name']}: {entry['source']}, batches of [{entry['batch_size']}, "
            f"{info['seq_len']}] {entry['dtype']} x {entry['num_batches']:,}, "
            f"{plural(entry['steps_per_epoch'], 'step')} per epoch"
        )
    for phase in info["phases"]:
        weights = ", ".join(f"{n} {w}" for n, w in phase["weights"].items())
        print(f"  from step {phase['start']:,}: {weights}")
    return EXIT_OK


def validate(args: argparse.Namespace, check: Any) -> int:
    """``check(namespace)``: the ``validate`` command of one component's source."""
    mixture = _load(args, "validate")
    if isinstance(mixture, int):
        return mixture
    reports, valid = [], True
    for component in mixture.components:
        one = argparse.Namespace(**{**vars(args), "file": str(component.source)})
        out = StringIO()
        with redirect_stdout(out):
            status = check(one)
        valid = valid and status == EXIT_OK
        text = out.getvalue().strip()
        reports.append(
            {
                "name": component.name,
                "valid": status == EXIT_OK,
                "report": json.loads(text) if args.json and text else text,
            }
        )
    problem = None
    if valid:
        try:
            with MixtureSource(mixture, verify="off") as source:
                for i in range(len(mixture.components)):
                    source.component(i)  # opened: its seq_len and size checked against the blend
        except (ZeroBatchError, ValueError) as e:
            problem, valid = str(e), False
    if args.json:
        print(
            json.dumps(
                {"path": args.file, "valid": valid, "components": reports, "problem": problem}
            )
        )
    else:
        for r in reports:
            print(f"{r['name']}: {r['report']}")
        if problem:
            print(f"INVALID {args.file}: {problem}")
        else:
            state = "OK" if valid else "INVALID"
            print(f"{state} {args.file}: mixture of {plural(len(reports), 'component')}")
    if not valid and problem:
        print(f"zerobatch validate: {problem}", file=sys.stderr)
    return EXIT_OK if valid else EXIT_INVALID

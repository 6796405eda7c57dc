"""acl-evaluate's ``--calibrate BUDGET``: choose a threshold on the evaluated split and write ``exit_policy.json``
beside the checkpoint (the choice and the record: :mod:`acl_runtime.calibration`)."""
import argparse
import os
from typing import Dict

from acl_runtime import calibration, exits
from acl_runtime.console import UsageError


def budget_type(text: str) -> calibration.Budget:
    """argparse ``type=`` for ``--calibrate``: a usage error (exit 2) naming the problem."""
    try:
        return calibration.parse_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    budgets = "; ".join(f"{k}=N: {text}" for k, text in calibration.BUDGETS.items())
    parser.add_argument(
        "--calibrate", type=budget_type, metavar="BUDGET",
        help=f"choose the threshold of --calibrate-policy among the swept settings on --split and write it to "
        f"{calibration.FILE_NAME} beside the checkpoint, which acl-predict, the hub and acl-export then apply "
        f"when no policy is given. {budgets}. max-drop takes the largest speed-up within the drop, min-speedup "
        "the best metric at that speed-up; a budget no setting meets is an error (exit 2) naming the closest. "
        "Calibrate on a validation split, never the one you report; a finer sweep (--thresholds ...) gives a "
        "finer choice")
    parser.add_argument("--calibrate-policy", choices=list(exits.POLICIES), default=calibration.DEFAULT_POLICY,
                        help="the policy --calibrate chooses a threshold of (default: %(default)s, the curve "
                        "METHOD.md compares methods along); it must be among --policy")
    parser.add_argument("--force", action="store_true",
                        help=f"with --calibrate: replace an existing {calibration.FILE_NAME} (refused without it)")


def precheck(parser: argparse.ArgumentParser, args) -> None:
    """What can be refused before the model loads."""
    if args.calibrate is None:
        if args.force:
            parser.error("--force applies to --calibrate (it replaces an existing exit_policy.json)")
        return
    if args.calibrate_policy not in args.policy:
        parser.error(f"--calibrate-policy {args.calibrate_policy} is not swept: add it to --policy")
    path = calibration.path_beside(args.checkpoint)
    if os.path.exists(path) and not args.force:
        raise UsageError(f"{path} exists; pass --force to calibrate again and replace it")
    try:  # before the sweep, which may take long, rather than at its end
        calibration.check_writable(path)
    except OSError as e:
        raise UsageError(f"--calibrate writes {path}, which cannot be written here ({e.strerror or e}): make "
                         f"{os.path.dirname(path)} writable, or calibrate a copy of the checkpoint in a folder you "
                         "can write to") from None


def apply(args, result: Dict) -> Dict:
    """Choose, write and return the record; :class:`UsageError` for a budget no setting meets."""
    try:
        setting = calibration.choose(result, args.calibrate, args.calibrate_policy)
    except calibration.Unmet as e:
        raise UsageError(f"--calibrate {args.calibrate}: {e}") from None
    record = calibration.make_record(result, setting, args.calibrate, args.checkpoint)
    path = calibration.path_beside(args.checkpoint)
    try:
        calibration.write(record, path, args.force)
    except (FileExistsError, OSError) as e:
        raise UsageError(str(e)) from None
    return dict(record, path=path)


def summary(record: Dict) -> str:
    return (f"calibrated ({record['budget']} on {record['split']}, {record['num_examples']} examples): "
            f"{record['policy']} {record['threshold']:g}, {record['metric']} {record['value']:.4g} against "
            f"{record['last_exit_value']:.4g} at the last exit, layer speed-up {record['layer_speedup']:.2f}x; "
            f"written to {record['path']}")

"""Checks of the scripts' flags that step 03's shared parser (torchtpu_rs.cli) does not make, said at once rather
than after a long run: a file to write (`--json PATH`, `--chart PNG`) must be in a folder that exists; a list of
counts (`--lengths`, `--slots`) must hold whole numbers of at least 1."""
import argparse
from pathlib import Path


def refuse_missing_folder(ap: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    """ap.error naming `flag` when `path` is given and its folder does not exist (nothing when it is None)."""
    if path and not Path(path).parent.is_dir():
        ap.error(f"{flag} {path}: the folder {Path(path).parent} does not exist")


def positive_ints(text: str) -> list[int]:
    """argparse `type` of a comma-separated list of whole numbers, each at least 1 (`--lengths 61,4081`): a bad
    item is named in argparse's error for the flag."""
    items = text.split(",")
    if bad := [item for item in items if not item.strip().isdecimal() or int(item) < 1]:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))}: not a whole number of at least 1 (a "
                                         "comma-separated list of them is expected)")
    return [int(item) for item in items]

"""A flag step 03's shared parser (torchtpu_rs.cli) does not have, checked as argparse parses it: a list of counts
(`--lengths`, `--slots`) must hold whole numbers of at least 1."""
import argparse


def positive_ints(text: str) -> list[int]:
    """argparse `type` of a comma-separated list of whole numbers, each at least 1 (`--lengths 61,4081`): a bad
    item is named in argparse's error for the flag."""
    items = text.split(",")
    if bad := [item for item in items if not item.strip().isdecimal() or int(item) < 1]:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))}: not a whole number of at least 1 (a "
                                         "comma-separated list of them is expected)")
    return [int(item) for item in items]

"""The console scripts' argument parser (fedrun-bench, fedrun-data, fedrun-report): a bad argument is
one line, `<prog>: error: <what>` naming the option, exit 2, as fedrun's own option errors are
(argparse would print its usage first: several lines)."""
from __future__ import annotations

import argparse
import sys


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        message = " ".join(message.split())  # argparse's messages are one line; make sure
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def refuse(self, option: str, value, why: str):
        """One line for a value argparse accepted but the script cannot use: `--option value: why`."""
        print(f"{self.prog}: error: {option} {value}: {why}", file=sys.stderr)
        sys.exit(2)

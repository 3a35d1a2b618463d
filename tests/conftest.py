"""The folder of this file is put on sys.path, so every test file, in any subfolder, imports the
shared helpers with `from helpers import ...`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

"""flavour.py (imported by the Python scripts): build_folder(), the build folder that
scripts/flavour.sh decides (BUILD_DIR, else GPU_LESSONS_TORCH's flavour's), so that the flavour
is decided in one place for the shell scripts and the Python ones."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_folder():
    decided = subprocess.run(["bash", "-c", 'root=$1; source "$root/scripts/flavour.sh" && '
                              'printf %s "$build"', "flavour", ROOT],
                             stdout=subprocess.PIPE, text=True)
    if decided.returncode != 0:
        sys.exit(2)  # flavour.sh said why
    return decided.stdout

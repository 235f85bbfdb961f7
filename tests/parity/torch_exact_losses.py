"""Runs tools/bench/gpt_mini_torch.py (the PyTorch twin of gpt-mini) unchanged, except that the
per-step losses it prints are not rounded.

The script rounds losses to 5 decimals for people to read; the parity test compares losses that
agree to a few 1e-6, which that rounding (up to 5e-6) would hide. It uses the builtin round() for
that, so shadowing round() in the script's namespace for 5-digit rounding (and nothing else)
prints the float32 loss exactly (json writes the shortest repr that reads back the same double).
Usage: torch_exact_losses.py PATH/TO/gpt_mini_torch.py [its arguments...]
"""
import builtins
import runpy
import sys


def _round(x, ndigits=None):
    return x if ndigits == 5 else builtins.round(x, ndigits)


script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, init_globals={"round": _round}, run_name="__main__")
